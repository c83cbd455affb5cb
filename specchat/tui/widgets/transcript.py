"""The conversation: user turns and streamed answers in a scroll that follows the bottom."""

from __future__ import annotations

from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Static

from engine.events import Finished, Started, Step
from specchat.tui.token_text import sanitize
from specchat.tui.widgets.repaint import repaint
from specchat.tui.widgets.token_stream import TokenStream


class UserTurnView(Static):
    def __init__(self, text: str) -> None:
        super().__init__(Content.assemble(("you ", "bold"), sanitize(text)), classes="user-turn")
        self.text = text


class AnswerView(Vertical):
    """One answer: a meta line (method, then the outcome) and the token stream."""

    def __init__(self, *, label: str, show_rejected: bool, classes: str = "answer") -> None:
        super().__init__(classes=classes)
        self.label = label
        self.stream = TokenStream(show_rejected=show_rejected)
        self.meta = Static(Content(label), classes="answer-meta")
        self.finished: Finished | None = None
        self.steps = 0

    def compose(self):
        yield self.meta
        yield self.stream

    def started(self, ev: Started) -> None:
        drafter = ev.drafter or ev.config.get("method", "")
        self.label = f"{ev.model or 'assistant'} · {drafter or 'baseline'}"
        self.meta.update(Content(self.label))

    def add_steps(self, steps: list[Step]) -> None:
        for step in steps:
            self.stream.add_step(step, refresh=False)
        self.steps += len(steps)
        repaint(self.stream)

    def finish(self, ev: Finished, stepped: bool = False) -> None:
        """``stepped``: teaching paused the engine, so wall-clock speed would mislead; use engine time."""
        self.finished = ev
        s = ev.stats
        bits = [self.label, f"{ev.tokens} token{'s' if ev.tokens != 1 else ''}"]
        if s.steps:
            bits.append(f"tau {s.tau:.2f}")
            engine_s = (s.draft_ms + s.verify_ms) / 1000
            if stepped:
                if engine_s > 0:
                    bits.append(f"{ev.tokens / engine_s:.1f} tok/s of engine time (pauses excluded)")
            else:
                bits.append(f"{s.tokens_per_s:.1f} tok/s")
        if ev.reason != "stop":
            bits.append(ev.reason.upper() if ev.reason == "cancelled" else ev.reason)
        if ev.error:
            bits.append(ev.error)
        self.meta.update(Content(" · ".join(bits)))
        if ev.reason == "cancelled":
            self.add_class("-cancelled")


class Transcript(VerticalScroll):
    def on_mount(self) -> None:
        self.anchor()

    def add_user(self, text: str) -> UserTurnView:
        view = UserTurnView(text)
        self.mount(view)
        return view

    def add_answer(self, *, label: str, show_rejected: bool) -> AnswerView:
        view = AnswerView(label=label, show_rejected=show_rejected)
        self.mount(view)
        return view

    def add_note(self, text: str, classes: str = "note") -> Static:
        note = Static(Content.styled(text, "italic"), classes=classes)
        self.mount(note)
        return note
