"""Running numbers: tokens/s, tau, acceptance per depth, draft vs verify time, measured speed-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.content import Content, Span

from engine.events import DraftPayoff, Finished, RunningStats, Started, Step
from specchat.tui.widgets.repaint import StickyHeight


@dataclass
class StatsState:
    """What the panel shows; updated from Steps, rendered on refresh."""

    stats: RunningStats | None = None
    steps: int = 0
    draft_ms_sum: float = 0.0
    verify_ms_sum: float = 0.0
    last_draft_ms: float = 0.0
    last_verify_ms: float = 0.0
    paused_steps: int = 0  # steps where the adaptive budget skipped drafting
    last_paused: bool = False
    payoff: DraftPayoff | None = None  # the budget's last word on whether drafting can pay here
    corpus_steps: int = 0  # n-gram steps drafted from the model's past answers
    corpus_kept: int = 0  # drafts kept on those steps
    kept: int = 0  # drafts kept on all steps
    configured_levels: int = 0  # num_steps in force (Started / ConfigApplied)
    last_levels: int = 0  # levels the budget asked of a per-level drafter at the last drafted step
    configured_topk: int = 0  # eagle_topk in force
    last_width: int = 0  # top-k the budget drafted such a drafter with at the last drafted step
    prefill_ms: float = 0.0  # request to first token: the prompt's prefill (Started.prefill_ms)
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens whose K/V came from earlier turns (not prefilled again)
    baseline_tps: float | None = None
    finished: str = ""
    stepping: bool = False  # teaching / step-through on now: the clock includes the pauses
    stepped: bool = False  # this answer was paused at some step (its wall-clock speed is not the engine's)
    context_limit: int = 0
    context_used: int = 0  # prompt + answer tokens so far
    prefill: tuple[int, int] | None = None  # (done, total) while a long prompt is prefilled

    def reset_answer(self) -> None:
        self.stats = None
        self.steps = 0
        self.draft_ms_sum = self.verify_ms_sum = 0.0
        self.last_draft_ms = self.last_verify_ms = 0.0
        self.paused_steps, self.last_paused = 0, False
        self.payoff = None
        self.corpus_steps = self.corpus_kept = self.kept = 0
        self.last_levels = self.last_width = 0
        self.finished = ""
        self.stepped = self.stepping
        self.prefill = None

    def started(self, ev: Started) -> None:
        self.prefill_ms = ev.prefill_ms
        self.prompt_tokens = ev.prompt_tokens
        self.reused_tokens = ev.reused_tokens
        self.context_limit = ev.context_limit
        self.context_used = ev.prompt_tokens
        self.config_in_force(ev.config)

    def config_in_force(self, config: dict) -> None:
        self.configured_levels = int(config.get("num_steps") or 0)
        self.configured_topk = int(config.get("eagle_topk") or 0)

    def finish(self, ev: Finished) -> None:
        self.finished = ev.reason if ev.reason != "stop" else "done"
        if ev.reason == "context" and self.context_limit:
            self.finished = "context full"

    def engine_tps(self) -> float:
        """Tokens per second of engine time (draft + verify), which teaching pauses do not inflate."""
        ms = self.draft_ms_sum + self.verify_ms_sum
        return self.stats.tokens / (ms / 1000) if self.stats and ms > 0 else 0.0

    def add(self, step: Step) -> None:
        self.stats = step.stats
        self.steps += 1
        self.draft_ms_sum += step.timing.draft_ms
        self.verify_ms_sum += step.timing.verify_ms
        self.last_draft_ms = step.timing.draft_ms
        self.last_verify_ms = step.timing.verify_ms
        self.paused_steps += step.draft_paused
        self.last_paused = step.draft_paused
        self.payoff = step.payoff
        self.kept += len(step.accepted)
        if step.tree.source == "corpus":
            self.corpus_steps += 1
            self.corpus_kept += len(step.accepted)
        if step.draft_levels:
            self.last_levels = step.draft_levels
        if step.draft_width:
            self.last_width = step.draft_width
        self.context_used = self.prompt_tokens + step.stats.tokens
        if self.stepping:
            self.stepped = True


class StatsView(StickyHeight):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"stat--label", "stat--value", "stat--bar", "stat--bar-empty",
                                             "stat--good"}

    DEFAULT_CSS = """
    StatsView { height: auto; }
    """

    BAR = 16

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.state = StatsState()

    def speedup(self) -> float | None:
        s = self.state.stats
        if s is None or not self.state.baseline_tps or not s.tokens_per_s or self.state.stepped:
            return None
        return s.tokens_per_s / self.state.baseline_tps

    def render(self) -> Content:
        st = self.state
        s = st.stats
        text: list[str] = []
        spans: list[Span] = []
        pos = 0

        def put(piece: str, style: str = "") -> None:
            nonlocal pos
            text.append(piece)
            if style and piece:
                spans.append(Span(pos, pos + len(piece), style))
            pos += len(piece)

        def row(label: str, value: str, style: str = ".stat--value") -> None:
            put(f"{label:<9}", ".stat--label")
            put(value, style)
            put("\n")

        if st.prefill is not None:
            done, total = st.prefill
            row("prefill", f"{done:,}/{total:,} prompt tokens · Esc stops")
        if st.context_limit:
            row("context", f"{st.context_used:,}/{st.context_limit:,} tokens")
        if s is None:
            if st.prefill is None:
                put("no answer yet", ".stat--label")
            return Content("".join(text).rstrip("\n"), spans)
        if st.stepping or st.stepped:
            row("tokens/s", f"{st.engine_tps():.1f} engine time (paused)")
        else:
            row("tokens/s", f"{s.tokens_per_s:.1f}")
        row("tau", f"{s.tau:.2f} (tokens/forward)")
        tok = f"{s.tokens} token{'s' if s.tokens != 1 else ''} in {s.steps} step{'s' if s.steps != 1 else ''}"
        row("tokens", tok + (f" · {st.finished}" if st.finished else ""))
        if st.prompt_tokens:  # the time to the first token: what a long prompt costs before any answer
            reused = f", {st.reused_tokens:,} reused" if st.reused_tokens else ""
            row("prompt", f"{st.prompt_tokens:,} tokens{reused} · first token {st.prefill_ms:.0f} ms")
        if st.steps:
            row("ms/step", f"draft {st.draft_ms_sum / st.steps:.1f} · verify {st.verify_ms_sum / st.steps:.1f}")
            row("last", f"draft {st.last_draft_ms:.1f} · verify {st.last_verify_ms:.1f}")
        if st.paused_steps:  # the adaptive budget skipped drafting: it cost more than it saved
            row("paused", f"drafting in {st.paused_steps}/{st.steps} steps" + (" (now)" if st.last_paused else ""))
        if st.payoff is not None and not st.payoff.pays:  # and why: the cost model's reckoning
            row("payoff", cannot_pay_words(st.payoff))
        if st.corpus_steps:  # the n-gram drafter's second source (the tree panel: "from past answers")
            share = f" · {st.corpus_kept / st.kept:.0%} of kept drafts" if st.kept else ""
            row("corpus", f"{st.corpus_steps}/{st.steps} steps{share}")
        cut = []  # where the budget drafts less than set: fewer levels, a chain instead of a tree
        if 0 < st.last_levels < st.configured_levels:
            cut.append(f"{st.last_levels} of {st.configured_levels}")
        if st.last_width == 1 < st.configured_topk:
            cut.append(f"a chain, not top-k {st.configured_topk}")
        if cut:
            row("levels", " · ".join(cut) + " (budget)")
        sp = self.speedup()
        if st.stepping or st.stepped:
            row("speed-up", "n/a (teaching pauses)", ".stat--label")
        elif sp is not None:
            row("speed-up", f"{sp:.2f}× (baseline {st.baseline_tps:.1f} tok/s)",
                ".stat--good" if sp >= 1.0 else ".stat--value")
        else:
            row("speed-up", "n/a (run compare, F3)", ".stat--label")
        if s.accept_per_depth:
            put("acceptance per depth\n", ".stat--label")
            for d, rate in enumerate(s.accept_per_depth, 1):
                filled = round(max(0.0, min(1.0, rate)) * self.BAR)
                put(f" d{d:<2}", ".stat--label")
                put("█" * filled, ".stat--bar")
                put("░" * (self.BAR - filled), ".stat--bar-empty")
                put(f" {rate:4.0%}\n", ".stat--value")
        return Content("".join(text).rstrip("\n"), spans)


def cannot_pay_words(payoff: DraftPayoff) -> str:
    """Why drafting cannot pay here, short enough for the panel: what a draft step costs in target
    steps ("draft 45%": 45% of a plain step), the acceptance per token it would need (engine/payoff.py)
    and the one it got."""
    step = f"can't pay: draft {payoff.draft_share:.0%}"
    if payoff.needed is None:
        return f"{step} · no acceptance pays"
    return f"{step} · needs {payoff.needed:.0%} · got {payoff.reached:.0%}"
