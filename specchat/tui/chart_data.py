"""What the charts view plots, computed from the engine's step events alone (no Textual here).

Why from the events: a trace replay, a reopened conversation and a live answer all reach the app
as the same :class:`~engine.events.Step` records, so the charts need no extra channel from the
engine and draw the same pictures for all three.

* Acceptance by depth is counted exactly as :class:`engine.answer_stats.RunningTally` counts it for the
  stats panel (a depth was "attempted" when the accepted path reached the level above it and the
  tree had children there), once for the current answer and once for the whole session.
* The verify-cost curve is the adaptive budget's own :class:`engine.costs.CostModel`, given the
  cost shape the session calibrated (``Started.cost_shape``) and fed the same observations the
  session feeds it (each step's tree size and verify time, per method; an answer's step 0 is the
  prefill's own token, which the budget never observes), so the curve drawn is the curve the
  budget prunes with, its estimates for unseen sizes included.
* Where the budget cut the tree: a step's ``proposed`` (nodes the drafter proposed) against the
  size verified; ``proposed`` is 0 while drafting is paused, or when an engine did not report it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.answer_stats import RunningTally
from engine.costs import CostModel
from engine.events import ConfigApplied, Finished, Started, Step

CUTS_KEPT = 8  # budget cuts remembered (the last steps')


@dataclass(frozen=True)
class BudgetCut:
    """One step's tree: the nodes proposed (0: unknown, or drafting paused) and the nodes verified."""

    index: int
    proposed: int
    kept: int
    paused: bool = False


@dataclass(frozen=True)
class DepthRate:
    """Acceptance at one depth: ``accepted`` of ``attempts`` steps kept a token there."""

    depth: int
    accepted: int
    attempts: int

    @property
    def rate(self) -> float:
        return self.accepted / self.attempts if self.attempts else 0.0


@dataclass(frozen=True)
class ChartView:
    """A snapshot of everything the charts draw; the screen renders one of these."""

    method: str = ""
    answers: int = 0  # speculative answers begun this session
    streaming: bool = False
    answer_depth: tuple[DepthRate, ...] = ()
    session_depth: tuple[DepthRate, ...] = ()
    committed: tuple[tuple[int, int], ...] = ()  # per step of the answer: (accepted drafts, target tokens)
    cost_measured: tuple[tuple[int, float], ...] = ()  # (tree size, learned ms) for the sizes seen
    cost_curve: tuple[tuple[int, float], ...] = ()  # the budget's estimate for every size up to the largest
    cuts: tuple[BudgetCut, ...] = ()  # the last steps' cuts, oldest first

    @property
    def empty(self) -> bool:
        return self.answers == 0


def depth_rates(tally: RunningTally) -> tuple[DepthRate, ...]:
    return tuple(DepthRate(d + 1, a, t) for d, (a, t) in enumerate(zip(tally.accepts, tally.attempts, strict=True))
                 if t)


class ChartData:
    """The session's chart data, fed every record the app receives (speculative lanes only).

    Lives on the app for the session's lifetime (the charts screen comes and goes); a listener
    (the open charts screen) is told after each change.
    """

    def __init__(self) -> None:
        self.version = 0  # bumps on every change: a view drawn at this version is current
        self._listeners: list[Callable[[], None]] = []
        self._method = ""
        self._answers = 0
        self._streaming = False
        self._answer = RunningTally(wall_clock=False)
        self._session = RunningTally(wall_clock=False)
        self._committed: list[tuple[int, int]] = []
        self._costs: dict[str, CostModel] = {}
        self._shape: dict[int, float] | None = None  # the session's calibrated cost shape
        self._cuts: deque[BudgetCut] = deque(maxlen=CUTS_KEPT)

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def add(self, lane: str, record: object) -> None:
        """One record from the engine: the chat's and a compare's speculative lanes ("spec", and
        "alt" when two methods are compared); the baseline lane (no drafting) and user turns are ignored."""
        if lane not in ("chat", "spec", "alt"):
            return
        if isinstance(record, Started):
            self._begin(str(record.config.get("method") or record.drafter or self._method), record.cost_shape)
        elif isinstance(record, ConfigApplied):
            self._method = str(record.config.get("method") or self._method)
        elif isinstance(record, Step):
            self._step(record)
        elif isinstance(record, Finished):
            self._streaming = False
        else:
            return
        self.version += 1
        for listener in list(self._listeners):
            listener()

    def _begin(self, method: str, shape: tuple[tuple[int, float], ...]) -> None:
        if shape and self._shape is None:  # measured once per session: every budget plans with it
            self._shape = dict(shape)
            for cost in self._costs.values():
                cost.shape = self._shape
        self._method = method
        self._answers += 1
        self._streaming = True
        self._answer = RunningTally(wall_clock=False)
        self._committed.clear()
        self._cuts.clear()

    def _step(self, step: Step) -> None:
        produced = len(step.committed)
        self._answer.add_step(step.tree, step.accepted, produced, produced, step.timing)
        self._session.add_step(step.tree, step.accepted, produced, produced, step.timing)
        drafts = sum(c.origin == "draft" for c in step.committed)
        self._committed.append((drafts, produced - drafts))
        if step.index == 0:  # the prefill's own token: no tree was verified
            return
        cost = self._costs.setdefault(self._method, CostModel(shape=self._shape))
        cost.observe(len(step.tree), step.timing.verify_ms)
        self._cuts.append(BudgetCut(step.index, step.proposed, len(step.tree), step.draft_paused))

    def view(self) -> ChartView:
        cost = self._costs.get(self._method)
        measured: tuple[tuple[int, float], ...] = ()
        curve: list[tuple[int, float]] = []
        if cost is not None and cost.ms:
            measured = tuple(sorted(cost.ms.items()))
            top = max([n for n, _ in measured] + [c.proposed for c in self._cuts])
            curve = [(n, ms) for n in range(1, top + 1) if (ms := cost.estimate(n)) is not None]
        return ChartView(
            method=self._method, answers=self._answers, streaming=self._streaming,
            answer_depth=depth_rates(self._answer), session_depth=depth_rates(self._session),
            committed=tuple(self._committed), cost_measured=measured, cost_curve=tuple(curve),
            cuts=tuple(self._cuts),
        )
