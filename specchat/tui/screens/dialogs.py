"""Small modal screens: a yes/no question, and the list of saved conversations."""

from __future__ import annotations

import time
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, OptionList, Static
from textual.widgets.option_list import Option

from specchat.tui.sessions import SavedSession


class ConfirmScreen(ModalScreen[bool]):
    """Asks before something that would lose work (quit or Ctrl+N while an answer runs)."""

    BINDINGS: ClassVar = [
        Binding("y", "answer(True)", "Yes", show=False),
        Binding("n,escape", "answer(False)", "No", show=False),
    ]

    def __init__(self, question: str, yes: str = "Yes") -> None:
        super().__init__(classes="dialog")
        self.question = question
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box"):
            yield Static(self.question, classes="dialog-text")
            with Horizontal(classes="dialog-buttons"):
                yield Button(f"{self.yes} (y)", id="yes", variant="error", compact=True)
                yield Button("No (n / Esc)", id="no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class SessionsScreen(ModalScreen["SavedSession | None"]):
    """Saved conversations, newest first; Enter reopens one."""

    BINDINGS: ClassVar = [Binding("escape", "dismiss_none", "Close", show=False)]

    def __init__(self, sessions: list[SavedSession], folder: str) -> None:
        super().__init__(classes="dialog")
        self.sessions = sessions
        self.folder = folder

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog-box sessions-box"):
            yield Static(Content.assemble(("Saved conversations", "bold"), f" · {self.folder}"),
                         classes="dialog-text")
            if self.sessions:
                options = []
                for n, s in enumerate(self.sessions):
                    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.modified))
                    turns = f"{s.turns} turn{'s' if s.turns != 1 else ''}"
                    options.append(Option(f"{when} · {turns} · {s.title}", id=str(n)))
                yield OptionList(*options, id="sessions-list")
                yield Static("Enter reopens (the conversation goes on from there) · Esc closes",
                             classes="dialog-hint")
            else:
                yield Static("No saved conversations yet: every chat is saved as you go.", classes="dialog-hint")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.sessions[int(event.option.id or 0)])

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
