"""Compare: the same prompt answered by the baseline (no drafter) and by speculative decoding.

The engine thread runs them one after the other, so each is timed alone; both panes stream at
their real speed. Under greedy decoding the two texts must be identical; the badge says so, or
shows where they first differ.

The badge reports a speed-up only when the runs can show one: a speculative run that accepted no
draft token did the baseline's work (one target forward per token), and a short answer is timed
over too few steps for its ratio to mean anything (a 19-token answer read "1.25x" with tau 1.00);
both are shown as noise, with the two speeds, instead of a ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Static

from engine.events import Finished, Started, Step
from specchat.tui.chrome import Chrome
from specchat.tui.messages import ChromeStale
from specchat.tui.textutil import first_difference, visible
from specchat.tui.trace import Record, UserTurn
from specchat.tui.widgets.prompt import PromptInput
from specchat.tui.widgets.repaint import repaint
from specchat.tui.widgets.title_bar import TitleBar
from specchat.tui.widgets.token_stream import TokenStream

# Below this many tokens per side a speed ratio is within timing noise (first-step and scheduling
# costs are a large share of a short run): the badge says so instead of printing a ratio.
MIN_TIMED_TOKENS = 32


@dataclass
class LaneResult:
    started: Started | None = None
    token_ids: list[int] = field(default_factory=list)
    token_texts: list[str] = field(default_factory=list)
    finished: Finished | None = None
    last_tps: float = 0.0
    drafts_accepted: int = 0  # committed tokens that came from the drafter

    def tps(self, engine_time: bool) -> float:
        """Tokens per second: wall clock, or (teaching pauses in between) draft + verify time only."""
        if self.finished is None:
            return 0.0
        s = self.finished.stats
        if not engine_time:
            return s.tokens_per_s
        ms = s.draft_ms + s.verify_ms
        return self.finished.tokens / (ms / 1000) if ms > 0 else 0.0

    @property
    def greedy(self) -> bool:
        return self.started is not None and float(self.started.config.get("temperature", 0.0) or 0.0) == 0.0


class ComparePane(Vertical):
    def __init__(self, lane: str, title: str, *, show_rejected: bool) -> None:
        super().__init__(id=f"{lane}-pane", classes="pane")
        self.lane = lane
        self.title = title
        self.stream = TokenStream(show_rejected=show_rejected, id=f"{lane}-stream")
        self.result = LaneResult()

    def compose(self) -> ComposeResult:
        yield Static(Content.styled(self.title, "bold"), classes="pane-title")
        with VerticalScroll(classes="pane-scroll"):
            yield self.stream
        yield Static("waiting", classes="pane-stats")

    def on_mount(self) -> None:
        self.query_one(VerticalScroll).anchor()

    def reset(self) -> None:
        self.stream.clear()
        self.result = LaneResult()
        self._stats("waiting")

    def _stats(self, text: str) -> None:
        self.query_one(".pane-stats", Static).update(Content(text))

    def show(self, records: Sequence[Record]) -> None:
        steps = 0
        for rec in records:
            if isinstance(rec, Started):
                self.stream.clear()
                self.result = LaneResult(started=rec)
                method = rec.config.get("method") or rec.drafter
                self.query_one(".pane-title", Static).update(
                    Content.assemble((self.title, "bold"), f" · {method}"))
                self._stats("running…")
            elif isinstance(rec, Step):
                self.stream.add_step(rec, refresh=False)
                self.result.token_ids.extend(c.id for c in rec.committed)
                self.result.token_texts.extend(c.text for c in rec.committed)
                self.result.drafts_accepted += sum(c.origin == "draft" for c in rec.committed)
                self.result.last_tps = rec.stats.tokens_per_s
                steps += 1
                s = rec.stats
                self._stats(f"{s.tokens} tokens · {s.tokens_per_s:.1f} tok/s · tau {s.tau:.2f} · running…")
            elif isinstance(rec, Finished):
                self.result.finished = rec
                s = rec.stats
                outcome = "" if rec.reason == "stop" else f" · {rec.reason.upper()}"
                self._stats(f"{rec.tokens} tokens · {s.tokens_per_s:.1f} tok/s · tau {s.tau:.2f}{outcome}")
        if steps:
            repaint(self.stream)


class CompareScreen(Screen):
    def __init__(self, *, show_rejected: bool, blink: bool, replay: bool) -> None:
        super().__init__(id="compare")
        self._show_rejected = show_rejected
        self._blink = blink
        self._replay = replay
        self.badge_text = ""
        self.first = ""  # the lane that ran first in the current compare
        self.stepped = False  # teaching paused the runs: compare engine time, not wall clock
        self.ready = False  # composed and mounted: records can be shown
        self._held: list[tuple[str, list[Record]]] = []  # records that came before the screen was composed

    def compose(self) -> ComposeResult:
        yield TitleBar(id="title")
        yield Static(Content("Compare: type a prompt; baseline and speculative run one after the other "
                             "(alternating which goes first), each from the same cache state."),
                     id="compare-question")
        with Horizontal(id="panes"):
            yield ComparePane("baseline", "Baseline (no drafter)", show_rejected=self._show_rejected)
            yield ComparePane("spec", "Speculative", show_rejected=self._show_rejected)
        yield Static("", id="badge")
        placeholder = (
            "replay: no model loaded" if self._replay else "Compare prompt · Enter runs both · F3 back to chat"
        )
        yield PromptInput(id="compare-prompt", placeholder=placeholder, blink=self._blink)
        yield Footer()

    def on_mount(self) -> None:
        prompt = self.query_one(PromptInput)
        if self._replay:
            prompt.disabled = True
        self.ready = True
        if self._held:
            self.call_after_refresh(self._show_held)

    def _show_held(self) -> None:
        held, self._held = self._held, []
        for lane, records in held:
            self._show_records(lane, records)
        self.post_message(ChromeStale())

    def on_screen_resume(self) -> None:
        prompt = self.query_one(PromptInput)
        if not prompt.disabled:
            prompt.focus()
        self.post_message(ChromeStale())

    def show_chrome(self, chrome: Chrome) -> None:
        self.query_one(TitleBar).show(chrome)

    def on_resize(self, event) -> None:
        self.set_class(event.size.width < 100, "-narrow")

    def pane(self, lane: str) -> ComparePane:
        return self.query_one(f"#{lane}-pane", ComparePane)

    def show_records(self, lane: str, records: Sequence[Record]) -> None:
        """Show one lane's records; until the screen is composed they wait, in order."""
        if not self.ready or self._held:
            self._held.append((lane, list(records)))
            return
        self._show_records(lane, records)

    def _show_records(self, lane: str, records: Sequence[Record]) -> None:
        rest: list[Record] = []
        for rec in records:
            if isinstance(rec, UserTurn):
                self.query_one("#compare-question", Static).update(
                    Content.assemble(("you ", "bold"), rec.text))
                self.pane("baseline").reset()
                self.pane("spec").reset()
                self.first = ""
                self._badge("starting…", "")
            else:
                if isinstance(rec, Started) and not self.first:
                    self.first = lane
                rest.append(rec)
        if rest:
            self.pane(lane).show(rest)
        base, spec = self.pane("baseline").result, self.pane("spec").result
        running = lane if self.pane(lane).result.started is not None and self.pane(lane).result.finished is None \
            else ""
        if running:
            self._badge(f"{'baseline' if running == 'baseline' else 'speculative'} running…", "")
        if base.finished is not None and spec.finished is not None:
            self._verdict(base, spec)

    def _badge(self, text: str, kind: str) -> None:
        badge = self.query_one("#badge", Static)
        self.badge_text = text
        badge.update(Content(text))
        for k in ("-identical", "-different", "-info"):
            badge.set_class(k == f"-{kind}", k)

    def fairness(self, base: LaneResult, spec: LaneResult) -> str:
        """How the two runs were timed: who went first, and the cache state both started from."""
        first = "baseline first" if self.first != "spec" else "speculative first"
        reused = {r.started.reused_tokens for r in (base, spec) if r.started is not None}
        if reused == {0}:
            cache = "both cold"
        elif len(reused) == 1:
            cache = f"both warm ({reused.pop():,} cached tokens)"
        else:
            cache = "unequal cache state"
        return f"{cache}, {first}"

    def speed(self, base: LaneResult, spec: LaneResult) -> str:
        """The badge's speed part: a speed-up only when the two runs did different work, long enough."""
        b, p = base.tps(self.stepped), spec.tps(self.stepped)
        if not (b and p):
            return ""
        speeds = f"{b:.1f} → {p:.1f} tok/s"
        tokens = min(len(base.token_ids), len(spec.token_ids))
        if spec.drafts_accepted == 0:  # kept short: the badge is one line at 120 columns
            return f" · no drafts accepted: same work, within noise ({speeds})"
        if tokens < MIN_TIMED_TOKENS:
            return f" · within noise at {tokens} tokens ({speeds})"
        clock = "engine time, teaching pauses excluded; " if self.stepped else ""
        return f" · speed-up {p / b:.2f}× ({speeds}; {clock}{self.fairness(base, spec)})"

    def _verdict(self, base: LaneResult, spec: LaneResult) -> None:
        assert base.finished is not None and spec.finished is not None
        speed = self.speed(base, spec)
        if "cancelled" in (base.finished.reason, spec.finished.reason):
            self._badge("cancelled: nothing to compare" + speed, "info")
            return
        if not (base.greedy and spec.greedy):
            self._badge("sampling (temperature > 0): the texts are not expected to match" + speed, "info")
            return
        diff = first_difference(base.token_ids, spec.token_ids)
        if diff is None:
            self._badge(f"✓ identical output under greedy decoding ({len(base.token_ids)} tokens){speed}",
                        "identical")
            return
        a = visible(base.token_texts[diff]) if diff < len(base.token_texts) else "end"
        b = visible(spec.token_texts[diff]) if diff < len(spec.token_texts) else "end"
        chars = len("".join(base.token_texts[:diff]))
        self._badge(f"≠ first difference at token {diff} (char {chars}): baseline ‹{a}› vs speculative ‹{b}›"
                    + speed, "different")

    def set_show_rejected(self, on: bool) -> None:
        for pane in self.query(ComparePane):
            pane.stream.show_rejected = on
