"""Compare: the same prompt answered by the baseline (no drafter) and by speculative decoding, or
by any two methods (``compare medusa,eagle3``: method A on the left, method B on the right).

The engine thread runs them one after the other, so each is timed alone; both panes stream at
their real speed. Under greedy decoding the texts must be identical; the badge says so, or
shows where they first differ. With two speculative methods the baseline runs too (no pane of its
own): each side's speed-up is against it, and a table puts their acceptance per depth side by
side, where Medusa's independent heads fall behind EAGLE's autoregressive one (teaching.py).

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
from specchat.tui.app_status import AppStatus
from specchat.tui.messages import StatusStale
from specchat.tui.screens import NARROW
from specchat.tui.teaching import COMPARE_DEPTHS
from specchat.tui.token_text import first_difference, visible
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
    depths: tuple[float, ...] = ()  # accepted share at depth 1, 2, ... (of the steps whose tree reached it)

    def add(self, rec: Record) -> LaneResult:
        """This lane's result with one more record (a Started begins a new one)."""
        if isinstance(rec, Started):
            return LaneResult(started=rec)
        if isinstance(rec, Step):
            self.token_ids.extend(c.id for c in rec.committed)
            self.token_texts.extend(c.text for c in rec.committed)
            self.drafts_accepted += sum(c.origin == "draft" for c in rec.committed)
            self.last_tps = rec.stats.tokens_per_s
            self.depths = rec.stats.accept_per_depth
        elif isinstance(rec, Finished):
            self.finished = rec
            self.depths = rec.stats.accept_per_depth or self.depths
        return self

    @property
    def method(self) -> str:
        return str(self.started.config.get("method") or self.started.drafter) if self.started else ""

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
            self.result = self.result.add(rec)
            if isinstance(rec, Started):
                self.stream.clear()
                self.query_one(".pane-title", Static).update(
                    Content.assemble((self.title, "bold"), f" · {self.result.method}"))
                self._stats("running…")
            elif isinstance(rec, Step):
                self.stream.add_step(rec, refresh=False)
                steps += 1
                s = rec.stats
                self._stats(f"{s.tokens} tokens · {s.tokens_per_s:.1f} tok/s · tau {s.tau:.2f} · running…")
            elif isinstance(rec, Finished):
                s = rec.stats
                outcome = "" if rec.reason == "stop" else f" · {rec.reason.upper()}"
                self._stats(f"{rec.tokens} tokens · {s.tokens_per_s:.1f} tok/s · tau {s.tau:.2f}{outcome}")
                self.call_after_refresh(self._show_end)
        if steps:
            repaint(self.stream)

    def _show_end(self) -> None:
        """A finished lane shows its last line unless the reader scrolled away: the anchor alone
        sometimes stopped a line short when the last step's height arrived after its scroll (seen
        in full test runs as a scrollbar thumb a fraction up; the same text either way)."""
        scroll = self.query_one(VerticalScroll)
        if scroll.is_anchored and scroll.scroll_y >= scroll.max_scroll_y - 2:  # within two lines of the end
            scroll.scroll_end(animate=False, immediate=True)


class CompareScreen(Screen):
    def __init__(self, *, show_rejected: bool, blink: bool, replay: bool) -> None:
        super().__init__(id="compare")
        self._show_rejected = show_rejected
        self._blink = blink
        self._replay = replay
        self.badge_text = ""
        self.depth_text = ""
        self.methods: tuple[str, ...] = ()  # (A, B) of the current compare; (): the baseline vs the method in force
        self.plain = LaneResult()  # the baseline's answer when both sides are speculative (no pane)
        self.first = ""  # the lane that ran first in the current compare
        self.stepped = False  # teaching paused the runs: compare engine time, not wall clock
        self.ready = False  # composed and mounted: records can be shown
        self._held: list[tuple[str, list[Record]]] = []  # records that came before the screen was composed

    def compose(self) -> ComposeResult:
        yield TitleBar(id="title")
        yield Static(Content(intro(self.methods)), id="compare-question")
        with Horizontal(id="panes"):
            yield ComparePane("baseline", "Baseline (no drafter)", show_rejected=self._show_rejected)
            yield ComparePane("spec", "Speculative", show_rejected=self._show_rejected)
        depths = Static("", id="depths")
        depths.display = False  # shown when both sides are speculative
        depths.styles.padding = (0, 1)
        depths.tooltip = COMPARE_DEPTHS
        yield depths
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
        self._titles()
        self.ready = True
        if self._held:
            self.call_after_refresh(self._show_held)

    def _show_held(self) -> None:
        held, self._held = self._held, []
        for lane, records in held:
            self._show_records(lane, records)
        self.post_message(StatusStale())

    def on_screen_resume(self) -> None:
        prompt = self.query_one(PromptInput)
        if not prompt.disabled:
            prompt.focus()
        self.post_message(StatusStale())

    def show_status(self, app_status: AppStatus) -> None:
        self.query_one(TitleBar).show(app_status)

    def on_resize(self, event) -> None:
        self.set_class(event.size.width < NARROW, "-narrow")

    def pane(self, lane: str) -> ComparePane:
        return self.query_one(f"#{lane}-pane", ComparePane)

    @property
    def two_methods(self) -> bool:
        """Method A is speculative too: the left pane shows it, the baseline runs without a pane."""
        return len(self.methods) == 2 and self.methods[0] != "none"

    def expect(self, methods: tuple[str, ...]) -> None:
        """The methods the next compare will run (chosen in the palette): said before the first run."""
        self.methods = methods
        if self.ready and self.pane("baseline").result.started is None:
            self.query_one("#compare-question", Static).update(Content(intro(methods)))
            self._titles()

    def lane_method(self, lane: str) -> str:
        """The method whose answer a lane shows now ("" before it started, or before the screen is)."""
        return self._result(lane).method if self.ready and not self._held else ""

    def _result(self, lane: str) -> LaneResult:
        if lane == "alt" or (lane == "baseline" and not self.two_methods):
            return self.pane("baseline").result
        return self.pane("spec").result if lane == "spec" else self.plain

    def show_records(self, lane: str, records: Sequence[Record]) -> None:
        """Show one lane's records; until the screen is composed they wait, in order."""
        if not self.ready or self._held:
            self._held.append((lane, list(records)))
            return
        self._show_records(lane, records)

    def _start(self, turn: UserTurn) -> None:
        """A new compare: its question, its two methods (the panes' titles), everything reset."""
        self.query_one("#compare-question", Static).update(Content.assemble(("you ", "bold"), turn.text))
        self.methods = turn.methods
        for pane in (self.pane("baseline"), self.pane("spec")):
            pane.reset()
        self._titles()
        self.plain = LaneResult()
        self.first = ""
        self.query_one("#depths", Static).display = self.two_methods
        self._show_depths()
        self._badge("starting…", "")

    def _titles(self) -> None:
        """The panes' titles: method A and method B, or the baseline and the speculative side."""
        left = ("Method A", "Method B") if self.two_methods else ("Baseline (no drafter)", "Speculative")
        for pane, title in zip((self.pane("baseline"), self.pane("spec")), left, strict=True):
            pane.title = title
            pane.query_one(".pane-title", Static).update(Content.styled(title, "bold"))

    def _show_records(self, lane: str, records: Sequence[Record]) -> None:
        rest: list[Record] = []
        for rec in records:
            if isinstance(rec, UserTurn):
                self._start(rec)
            else:
                if isinstance(rec, Started) and not self.first:
                    self.first = lane
                rest.append(rec)
        if rest and lane == "baseline" and self.two_methods:
            for rec in rest:
                self.plain = self.plain.add(rec)
        elif rest:
            self.pane("baseline" if lane == "alt" else lane).show(rest)
        result = self._result(lane)
        if result.started is not None and result.finished is None:
            if self.two_methods:
                what = "baseline" if lane == "baseline" else result.method
            else:
                what = "baseline" if lane == "baseline" else "speculative"
            self._badge(f"{what} running…", "")
        if self.two_methods:
            self._show_depths()
        sides = [self.pane("baseline").result, self.pane("spec").result]
        if all(r.finished is not None for r in sides):
            if not self.two_methods:
                self._verdict(*sides)
            elif self.plain.finished is not None:
                self._verdict_two(self.plain, *sides)

    def _show_depths(self) -> None:
        """Method A's and method B's accepted share at each depth, side by side (and their tau)."""
        rows = [r for r in (self.pane("baseline").result, self.pane("spec").result) if r.started is not None]
        self.depth_text = depth_table(rows)
        self.query_one("#depths", Static).update(Content(self.depth_text))

    def _badge(self, text: str, kind: str) -> None:
        badge = self.query_one("#badge", Static)
        self.badge_text = text
        badge.update(Content(text))
        for k in ("-identical", "-different", "-info"):
            badge.set_class(k == f"-{kind}", k)

    def fairness(self, *results: LaneResult) -> str:
        """How the runs were timed: who went first, and the cache state they all started from."""
        if self.two_methods:
            first = f"{'baseline' if self.first == 'baseline' else self._result(self.first).method} first"
        else:
            first = "baseline first" if self.first != "spec" else "speculative first"
        reused = {r.started.reused_tokens for r in results if r.started is not None}
        if reused == {0}:
            cache = "both cold" if len(results) == 2 else "all cold"
        elif len(reused) == 1:
            cache = f"{'both' if len(results) == 2 else 'all'} warm ({reused.pop():,} cached tokens)"
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

    def speedup(self, base: LaneResult, side: LaneResult) -> str:
        """One side's speed-up against the baseline, or why it is not one (as :meth:`speed`)."""
        b, p = base.tps(self.stepped), side.tps(self.stepped)
        if not (b and p):
            return f"{side.method} -"
        if side.drafts_accepted == 0:
            return f"{side.method} no drafts accepted"
        if min(len(base.token_ids), len(side.token_ids)) < MIN_TIMED_TOKENS:
            return f"{side.method} within noise"
        return f"{side.method} {p / b:.2f}×"

    def _verdict_two(self, base: LaneResult, a: LaneResult, b: LaneResult) -> None:
        """Method A and method B against the baseline: identical text, and each one's speed-up."""
        assert base.finished is not None and a.finished is not None and b.finished is not None
        clock = "engine time; " if self.stepped else ""
        speed = (f" · vs baseline {base.tps(self.stepped):.1f} tok/s: {self.speedup(base, a)}, "
                 f"{self.speedup(base, b)} ({clock}{self.fairness(base, a, b)})")
        if "cancelled" in (base.finished.reason, a.finished.reason, b.finished.reason):
            self._badge("cancelled: nothing to compare" + speed, "info")
            return
        if not (base.greedy and a.greedy and b.greedy):
            self._badge("sampling (temperature > 0): the texts are not expected to match" + speed, "info")
            return
        for side in (a, b):
            diff = first_difference(base.token_ids, side.token_ids)
            if diff is not None:
                got = visible(side.token_texts[diff]) if diff < len(side.token_texts) else "end"
                want = visible(base.token_texts[diff]) if diff < len(base.token_texts) else "end"
                self._badge(f"≠ {side.method} differs from the baseline at token {diff}: ‹{got}› vs ‹{want}›"
                            + speed, "different")
                return
        self._badge(f"✓ both identical to the baseline under greedy decoding ({len(base.token_ids)} tokens)"
                    + speed, "identical")

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


def intro(methods: tuple[str, ...]) -> str:
    """The line above the panes before the first compare: what Enter will run."""
    if len(methods) == 2 and methods[0] != "none":
        return (f"Compare: type a prompt; {methods[0]}, {methods[1]} and the baseline run one after the other "
                "(rotating which goes first), each from the same cache state.")
    return ("Compare: type a prompt; baseline and speculative run one after the other "
            "(alternating which goes first), each from the same cache state.")


def depth_table(results: Sequence[LaneResult], columns: int = 8) -> str:
    """Rows of accepted share per depth (d1 = the first drafted token), one per method, and tau::

        accepted at depth   d1   d2   d3   d4   tau
        medusa             71%  42%  20%   8%  1.9
        eagle3             80%  66%  55%  43%  2.6
    """
    rows = [r for r in results if r.method and r.method != "none"]
    if not rows:
        return ""
    deepest = min(columns, max((len(r.depths) for r in rows), default=0))
    name = max(17, *(len(r.method) for r in rows))
    lines = [f"{'accepted at depth':<{name}}" + "".join(f"{f'd{d}':>5}" for d in range(1, deepest + 1)) + "  tau"]
    for r in rows:
        cells = "".join(f"{f'{r.depths[d]:.0%}' if d < len(r.depths) else '-':>5}" for d in range(deepest))
        stats = r.finished.stats if r.finished is not None else None
        tau = f"{stats.tau:5.2f}" if stats is not None else "    …"
        lines.append(f"{r.method:<{name}}{cells}{tau}")
    return "\n".join(lines)
