"""What one answer carries from step to step in :class:`engine.session.Session`'s step loop.

Why a module of its own: the session reads top to bottom as the loop's small functions, and this
is the state they hand each other; keeping it apart keeps the session's file short.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.adaptive import DraftBudget
from engine.config import SpecConfig
from engine.drafters.base import Drafter, NoDrafter
from engine.events import FinishReason, Origin, StepTiming
from engine.stats import RunningTally
from engine.tree import DraftTree, Verdict


@dataclass
class AnswerState:
    """What one answer carries from step to step: the settings, the drafter, and what the last
    forward produced (``tree``, ``verdict``, ``pending``), emitted at the top of the next step."""

    config: SpecConfig
    fixed: bool  # generate() with its own config: hot-swapped settings do not apply
    root: int  # the token the next tree grows from: produced, not yet in the cache
    tally: RunningTally
    decoder: Any  # the tokenizer's incremental decoder
    timing: StepTiming
    tree: DraftTree
    verdict: Verdict
    pending: list[tuple[int, Origin]]  # tokens the last forward produced, not yet emitted
    proposed: int = 1  # nodes the drafter proposed, before pruning
    drafted: bool = True  # False: the budget paused drafting this step
    levels: int = 0  # levels asked of a drafter that pays per level (0: not such a drafter)
    width: int = 0  # top-k the budget chose for such a drafter (0: not chosen)
    grown: int = 0  # levels such a drafter actually grew (its confidence may stop it early)
    index: int = 0  # the next Step's index
    text: list[str] = field(default_factory=list)
    finished: FinishReason | None = None
    method: str | None = None  # the method whose drafter and budget are in use
    drafter: Drafter = field(default_factory=NoDrafter)
    budget: DraftBudget = field(default_factory=DraftBudget)
    # the last (settings, levels, top-k) the budget asked of the drafter, and that request: a validated
    # copy of the settings costs as much as a tenth of a drafted level, and mostly repeats
    asked: tuple[SpecConfig, int, int, SpecConfig] | None = None
