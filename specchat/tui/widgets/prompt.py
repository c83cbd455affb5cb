"""The multi-line prompt: Enter sends, Ctrl+J (or Shift+Enter where the terminal reports it) adds a
line, Up/Down recall earlier prompts."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = frozenset({"ctrl+j", "shift+enter", "ctrl+enter"})


class PromptInput(TextArea):
    class Submitted(Message):
        def __init__(self, prompt: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

    def __init__(self, *, id: str | None = None, placeholder: str = "", blink: bool = True) -> None:
        super().__init__(
            "",
            id=id,
            soft_wrap=True,
            tab_behavior="focus",
            show_line_numbers=False,
            highlight_cursor_line=False,
            compact=True,
            placeholder=placeholder,
        )
        self.cursor_blink = blink
        self.prompt_history: list[str] = []
        self._recall: int | None = None  # index into history while recalling
        self._draft = ""

    async def _on_key(self, event: events.Key) -> None:
        key = event.key
        if key == "enter":
            event.stop()
            event.prevent_default()
            self._submit()
            return
        if key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        row, _ = self.cursor_location
        if key == "up" and row == 0 and self.prompt_history:
            event.stop()
            event.prevent_default()
            self._recall_step(-1)
            return
        if key == "down" and row == self.document.line_count - 1 and self._recall is not None:
            event.stop()
            event.prevent_default()
            self._recall_step(1)
            return
        await super()._on_key(event)

    def _recall_step(self, delta: int) -> None:
        if self._recall is None:
            self._draft = self.text
            idx = len(self.prompt_history)
        else:
            idx = self._recall
        idx += delta
        if idx < 0:
            idx = 0
        if idx >= len(self.prompt_history):
            self._recall = None
            self.load_text(self._draft)
        else:
            self._recall = idx
            self.load_text(self.prompt_history[idx])
        self.move_cursor(self.document.end)

    def carry(self, text: str, *, send: bool) -> None:
        """Take over text typed elsewhere (on the loading screen), and send it if the user asked to."""
        self.load_text(text)
        self.move_cursor(self.document.end)
        if send:
            self._submit()

    def _submit(self) -> None:
        text = self.text.strip("\n")
        if not text.strip():
            return
        if not self.prompt_history or self.prompt_history[-1] != text:
            self.prompt_history.append(text)
        self._recall = None
        self._draft = ""
        self.post_message(self.Submitted(self, text))
