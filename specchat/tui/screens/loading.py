"""Shown while the engine thread loads the model: progress, not a frozen terminal."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Center, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, ProgressBar, Static

from specchat.tui.widgets.prompt import PromptInput


class LoadingScreen(Screen):
    def __init__(self, what: str) -> None:
        super().__init__(id="loading")
        self.what = what
        self.stages: list[str] = []
        self._send = False  # Enter was pressed: send the typed message once the model is ready

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-box"):
            yield Static(Content.assemble(("specchat", "bold"), f" · loading {self.what}"), id="loading-title")
            with Center():
                yield ProgressBar(id="loading-bar", show_eta=False)
            yield Static("starting the engine thread…", id="loading-stage")
            yield Static("", id="loading-error")
        yield PromptInput(id="early-prompt", placeholder="Type your first message while the model loads · Enter "
                          "sends it when ready")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(PromptInput).focus()

    def on_prompt_input_submitted(self, event: PromptInput.Submitted) -> None:
        event.stop()
        self._send = True
        self.query_one("#loading-stage", Static).update(
            Content("your message will be sent as soon as the model is ready"))

    def typed(self) -> tuple[str, bool]:
        """The text typed while loading, and whether Enter asked to send it."""
        prompt = self.query_one(PromptInput)
        return prompt.text, self._send

    def progress(self, stage: str, done: int, total: int) -> None:
        if not self.stages or self.stages[-1] != stage:
            self.stages.append(stage)
        bar = self.query_one(ProgressBar)
        bar.update(total=total if total > 0 else None, progress=done)
        counts = f" ({done}/{total})" if total > 0 else ""
        self.query_one("#loading-stage", Static).update(Content(f"{stage}{counts}"))

    def failed(self, message: str) -> None:
        self.query_one(ProgressBar).display = False  # nothing is happening any more: stop animating
        self.query_one("#loading-stage", Static).update(Content("loading failed"))
        self.query_one("#loading-error", Static).update(
            Content.assemble(("could not load: ", "bold"), message, "\n\nPress Ctrl+Q to quit.")
        )
        self.add_class("-failed")
