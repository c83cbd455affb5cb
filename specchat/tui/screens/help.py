"""The help screen: what draft, verify, accept, bonus and tau mean; the three knobs; the keys."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

from specchat.tui.keys import APP_KEYS
from specchat.tui.teaching import HELP_MARKDOWN


def keys_markdown(keymap: dict[str, str]) -> str:
    rows = ["## Keys", "", "| key | what it does | id (remap in config.toml `[keys]`) |", "|---|---|---|"]
    for k in APP_KEYS:
        key = keymap.get(k.id, k.key)
        rows.append(f"| `{key}` | {k.help} | `{k.id}` |")
    rows += [
        "| `enter` | send the prompt (`ctrl+j` adds a line; `up`/`down` recall earlier prompts) | |",
        "| `ctrl+p` | command palette: settings like `num_steps 3`, themes, modes | |",
        "| `left`/`right` | in the tree panel (`tab` focuses it): browse steps | |",
    ]
    return "\n".join(rows)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar = [
        Binding("escape,f1,q", "dismiss", "Close", id="help-close"),
    ]

    def __init__(self, keymap: dict[str, str]) -> None:
        super().__init__(id="help")
        self.keymap = keymap

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Markdown(HELP_MARKDOWN + "\n" + keys_markdown(self.keymap), id="help-text")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
