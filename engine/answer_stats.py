"""Running statistics of one answer: what every Step event reports as ``stats``.

Why a module of its own: the session and the app's scripted session (specchat/tui/scripted.py, which
plays answers without a model) must define tau, acceptance per depth and elapsed time the same
way, or the demo would teach numbers the engine never reports.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.events import RunningStats, StepTiming
from engine.tree import DraftTree


@dataclass
class RunningTally:
    """Totals of the steps so far, and their :class:`RunningStats`.

    ``tau`` is tokens *produced* per target forward: a stop token that ends the answer counts
    (the forward made it) although it is not committed. ``wall_clock=False`` measures elapsed time
    as the sum of the steps' timings instead, for answers replayed without real time passing.
    """

    started: float = field(default_factory=time.perf_counter)
    wall_clock: bool = True
    tokens: int = 0
    produced: int = 0  # tokens the forwards produced, a final stop token included (for tau)
    steps: int = 0
    timed_ms: float = 0.0  # the steps' timings summed (elapsed time when not wall_clock)
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    attempts: list[int] = field(default_factory=list)  # per depth: steps that could accept there
    accepts: list[int] = field(default_factory=list)

    def add_step(self, tree: DraftTree, accepted: Sequence[int], new_tokens: int, produced: int,
                 timing: StepTiming) -> None:
        """One step: ``tree`` verified, ``accepted`` its kept path (node indices), ``new_tokens``
        committed to the answer out of ``produced``."""
        self.steps += 1
        self.tokens += new_tokens
        self.produced += produced
        self.timed_ms += timing.total_ms
        self.draft_ms += timing.draft_ms
        self.verify_ms += timing.verify_ms
        # depth d+1 was attempted if the path reached depth d and the node there has children
        has_children = set(tree.parents[1:])
        for d, node in enumerate((0, *accepted)):
            if node not in has_children:
                break
            while len(self.attempts) <= d:
                self.attempts.append(0)
                self.accepts.append(0)
            self.attempts[d] += 1
            if d < len(accepted):
                self.accepts[d] += 1

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started if self.wall_clock else self.timed_ms / 1e3

    def snapshot(self) -> RunningStats:
        elapsed = self.elapsed_s()
        return RunningStats(
            tokens=self.tokens,
            steps=self.steps,
            elapsed_s=elapsed,
            tokens_per_s=self.tokens / elapsed if elapsed > 0 else 0.0,
            tau=self.produced / self.steps if self.steps else 0.0,
            accept_per_depth=tuple(a / t for a, t in zip(self.accepts, self.attempts, strict=True) if t),
            draft_ms=self.draft_ms,
            verify_ms=self.verify_ms,
        )
