"""Cost-aware draft budgets: verify only as much of the tree as is expected to pay.

Why: on a GPU, verifying 16 tokens costs about what verifying 1 does, so a drafter may propose
freely. On a CPU it does not (measured on a 2-core EPYC: 16 tokens cost ~2x one token), and a
drafter that fires on weak evidence — an n-gram match of one token in free-form text — makes
decoding slower than no speculation at all. Each step we therefore keep the prefix of the
proposed tree (nodes ranked by estimated probability of being accepted) that maximises expected
tokens per unit of verify time, which may be the root alone: a plain decoding step.

Both estimates are learned online, per session:
- acceptance: the conditional probability that a tested node is accepted, by depth, by whether it
  is its parent's first child, and by whether the previous step accepted two drafts or more
  (acceptance comes in runs: while an answer copies from the prompt nearly everything is kept, in
  free text nearly nothing); estimates drift back towards an optimistic prior while unused, so a
  budget that shrank to nothing re-tests the drafter now and then;
- cost: the verify time of an n-node tree, an average per n, filled in by a line fit where unseen.

Pruning bounds the verify cost, but the drafting itself is paid before anything is known: a
drafter that rarely lands (a weak EAGLE head on free text) makes every step slower than a plain
one. :class:`DraftGate` compares the measured rate of drafted steps (tokens per ms, drafting
included) with plain decoding's and pauses drafting while it loses, retrying after a pause that
doubles each time it still loses (4 steps up to 128), so a useless drafter costs a few percent
instead of half the speed, and a drafter that starts landing again is back within a pause. For a
drafter that pays a forward per level, :meth:`DraftBudget.draft_depth` also picks how many levels
to draft (measured on the 2-core VM: a weak EAGLE-3 head drafts one level in ~2 ms instead of five
in ~9 ms, since deeper levels would mostly be pruned or rejected anyway).

Pruning a tree to a subtree that contains the root never changes what greedy verification
outputs, and keeps the target distribution under sampling: this is a speed choice only.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from engine.drafters.tree_search import Candidates, StopRule
from engine.tree import DraftTree

_PRIOR = 0.5  # optimistic acceptance before any evidence
_RECOVER = 0.02  # per step, how far an untested estimate drifts back to the prior
_LEARN = 0.1  # weight of a new observation in the acceptance average
_COST_LEARN = 0.2  # weight of a new timing in the per-size cost average
_MAX_DEPTH = 64
_GATE_LEARN = 0.25  # weight of a drafted step in the drafted-rate average
_GATE_MARGIN = 0.97  # drafting must keep at least this share of plain decoding's rate
_CHEAP_DRAFT = 0.05  # drafting cheaper than this share of a plain step is never paused
_MIN_PAUSE, _MAX_PAUSE = 4, 128  # steps without drafting after a losing drafted step


@dataclass
class CostModel:
    """Milliseconds as a function of a size n: a verify's tree size (root included), or the
    number of levels a drafter grew.

    ``shape``: the relative cost by size measured for this session (engine/calibrate.py), or
    None. With it, a size not seen lately is estimated from the nearest size seen, scaled along
    the measured curve: the live steps give the level, the calibration the shape. Without it,
    a least-squares line through the sizes seen."""

    ms: dict[int, float] = field(default_factory=dict)
    lone_slope: float = 0.05  # with one size seen: relative cost per extra unit (verify: CPU-typical)
    shape: dict[int, float] | None = None

    def observe(self, n: int, ms: float) -> None:
        old = self.ms.get(n)
        self.ms[n] = ms if old is None else old + _COST_LEARN * (ms - old)

    def estimate(self, n: int) -> float | None:
        if n in self.ms:
            return max(1e-3, self.ms[n])
        if not self.ms:
            return None
        if self.shape:
            seen = min(self.ms, key=lambda m: (abs(m - n), m))
            return max(1e-3, self.ms[seen] * self.relative(n) / self.relative(seen))
        # least-squares line through the sizes seen; with one size, assume the CPU-typical slope
        xs, ys = zip(*sorted(self.ms.items()), strict=True)
        if len(xs) == 1:
            s = self.lone_slope
            return max(1e-3, ys[0] * (1.0 + s * (n - 1)) / (1.0 + s * (xs[0] - 1)))
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx)
        return max(1e-3, my + slope * (n - mx))

    def relative(self, n: int) -> float:
        """The measured shape at n: linear between measured sizes, and beyond the largest along
        the line through the last two (the curve is close to linear there: arithmetic-bound)."""
        assert self.shape
        sizes = sorted(self.shape)
        if n in self.shape or len(sizes) == 1 or n < sizes[0]:
            return self.shape.get(n, self.shape[sizes[0]] if n < sizes[0] else self.shape[sizes[-1]])
        i = min(bisect.bisect(sizes, n), len(sizes) - 1)  # sizes[i - 1] < n < sizes[i], or beyond the last
        lo, hi = sizes[i - 1], sizes[i]
        return self.shape[lo] + (n - lo) / (hi - lo) * (self.shape[hi] - self.shape[lo])


@dataclass
class AcceptanceModel:
    """P(node accepted | parent accepted), by depth, first-child-or-not and the last step's run."""

    rate: dict[tuple[int, bool, bool], float] = field(default_factory=dict)
    hot: bool = False  # the previous step accepted two drafts or more

    def get(self, depth: int, first: bool) -> float:
        """Unseen depths borrow the nearest shallower estimate: deep nodes only get tested if
        they are kept, so a fixed pessimistic prior for them would never be corrected."""
        depth = min(depth, _MAX_DEPTH)
        for d in range(depth, 0, -1):
            rate = self.rate.get((d, first, self.hot))
            if rate is not None:
                return rate
        return _PRIOR

    def observe(self, tree: DraftTree, accepted: tuple[int, ...]) -> None:
        """Record, for every node whose parent was on the accepted path, whether it was kept."""
        self._record(tree, accepted)
        if len(tree) > 1:
            self.hot = len(accepted) >= 2

    def _record(self, tree: DraftTree, accepted: tuple[int, ...]) -> None:
        on_path = {0, *accepted}
        seen: set[tuple[int, bool, bool]] = set()
        first_child: dict[int, int] = {}
        for i in range(1, len(tree)):
            parent = tree.parents[i]
            first_child.setdefault(parent, i)
            if parent not in on_path:
                continue
            key = (min(tree.depths[i], _MAX_DEPTH), first_child[parent] == i, self.hot)
            old = self.rate.get(key, _PRIOR)
            self.rate[key] = old + _LEARN * ((i in on_path) - old)
            seen.add(key)
        for key, value in self.rate.items():
            if key not in seen and value < _PRIOR:  # only pessimism fades: confidence waits for evidence
                self.rate[key] = value + _RECOVER * (_PRIOR - value)


_CONFIDENCE_EDGES = (0.05, 0.15, 0.3, 0.5, 0.7, 0.85, 0.95)  # buckets of a draft's own probability


@dataclass
class ConfidenceModel:
    """P(node accepted | parent accepted) as a function of the drafter's own probability for it.

    EAGLE-2's observation: a draft head's confidence predicts acceptance well, and it is known
    per node before verifying, where the depth model only knows averages. Each bucket starts at
    its midpoint (trusting the drafter) and learns from what verification keeps, so an over- or
    under-confident head is corrected within an answer.
    """

    rate: dict[int, float] = field(default_factory=dict)

    @staticmethod
    def bucket(p: float) -> int:
        return sum(p >= edge for edge in _CONFIDENCE_EDGES)

    def get(self, p: float) -> float:
        b = self.bucket(p)
        if b in self.rate:
            return self.rate[b]
        lo = _CONFIDENCE_EDGES[b - 1] if b else 0.0
        hi = _CONFIDENCE_EDGES[b] if b < len(_CONFIDENCE_EDGES) else 1.0
        return (lo + hi) / 2

    def observe(self, tree: DraftTree, accepted: tuple[int, ...]) -> None:
        on_path = {0, *accepted}
        for i in range(1, len(tree)):
            if tree.parents[i] in on_path:
                b = self.bucket(tree.draft_probs[i])
                old = self.get(tree.draft_probs[i])
                self.rate[b] = old + _LEARN * ((i in on_path) - old)

    def path(self, cands: Candidates, i: int) -> float:
        """Estimated probability that candidate ``i`` and all its ancestors are accepted."""
        prob = 1.0
        for a in cands.ancestors(i):
            prob *= self.get(math.exp(cands.logp[a]))
        return prob


@dataclass
class DraftGate:
    """Whether to draft at all this step (see the module docstring)."""

    rate: float | None = None  # tokens per ms of drafted steps, drafting included (average)
    draft_ms: float | None = None  # drafting time per drafted step (average)
    pause: int = 0  # steps left without drafting
    next_pause: int = _MIN_PAUSE
    # The first drafted step of an answer, and the first after a pause, also pays the drafter's
    # catch-up (an EAGLE head extends its cache over the prompt or the paused steps): a one-off
    # cost, so that step is not judged.
    settling: bool = True

    def should_draft(self) -> bool:
        if self.pause > 0:
            self.pause -= 1
            return False
        return True

    def observe(self, tokens: int, draft_ms: float, verify_ms: float, plain_ms: float | None) -> bool:
        """A drafted step committed ``tokens``; ``plain_ms``: the estimated time of a plain step.
        Returns whether the step was judged (False for a settling step)."""
        if self.settling:
            self.settling = False
            return False
        rate = tokens / max(1e-3, draft_ms + verify_ms)
        self.rate = rate if self.rate is None else self.rate + _GATE_LEARN * (rate - self.rate)
        self.draft_ms = draft_ms if self.draft_ms is None else self.draft_ms + _GATE_LEARN * (draft_ms - self.draft_ms)
        if plain_ms is None or self.draft_ms < _CHEAP_DRAFT * plain_ms or self.rate >= _GATE_MARGIN / plain_ms:
            self.next_pause = _MIN_PAUSE
            return True
        self.pause = self.next_pause
        self.next_pause = min(_MAX_PAUSE, 2 * self.next_pause)
        self.rate = None  # the retry after the pause is judged on its own, not on the losses before it
        self.settling = True
        return True


class DraftBudget:
    """Chooses whether to draft (:class:`DraftGate`) and how much of each proposed tree to verify."""

    def __init__(self, cost_shape: dict[int, float] | None = None) -> None:
        self.cost = CostModel(shape=cost_shape)  # verify ms by tree size
        self.draft_cost = CostModel(lone_slope=1.0)  # ms by levels drafted: one head forward per level
        self.acceptance = AcceptanceModel()
        self.confidence = ConfidenceModel()
        self.gate = DraftGate()

    def restart(self) -> None:
        """A drafter takes over (an answer's first step, or a switch of method): its first drafted
        step also pays for catching up on the history, a one-off cost the gate must not judge."""
        self.gate.settling = True

    def draft_depth(self, max_levels: int) -> int:
        """How many levels a drafter that pays per level (an EAGLE head, a draft model) should grow.

        Pruning only trims what was drafted; the levels themselves are paid first. So pick the
        depth d that maximises expected tokens per ms of the chain of first children, drafting
        (by levels) and verifying (d + 1 nodes) included. Depths not drafted lately borrow the
        nearest shallower estimate, and pessimism fades back to the prior, so the depth grows again
        when the drafts start landing.
        """
        if max_levels <= 1 or not self.draft_cost.ms or self.cost.estimate(1) is None:
            return max_levels
        best_depth, best_rate = max_levels, -1.0
        expected, path = 1.0, 1.0
        for depth in range(1, max_levels + 1):
            path *= self.acceptance.get(depth, True)
            expected += path
            ms = self.draft_cost.estimate(depth) + self.cost.estimate(depth + 1)  # type: ignore[operator]
            if expected / ms > best_rate:
                best_depth, best_rate = depth, expected / ms
        return best_depth

    def stop_rule(self) -> StopRule | None:
        """For a drafter that pays per level: stop growing once the likeliest frontier path is
        worth less than a level costs. Another level can add at most that path's probability in
        accepted tokens, each worth a plain step's time, so growing pays only while
        P(path) * plain_ms exceeds the level's ms. None until both costs are measured."""
        plain = self.cost.estimate(1)
        one, two = self.draft_cost.estimate(1), self.draft_cost.estimate(2)
        if plain is None or one is None or two is None:
            return None
        threshold = max(two - one, 0.0) / plain
        confidence = self.confidence

        def stop(cands: Candidates, frontier: list[int]) -> bool:
            return max(confidence.path(cands, i) for i in frontier) < threshold

        return stop

    def prune(self, tree: DraftTree) -> DraftTree:
        if len(tree) == 1:
            return tree
        # path probability of each node = product of conditional acceptances along its path
        prob = [1.0] * len(tree)
        seen_parent: set[int] = set()
        for i in range(1, len(tree)):
            parent = tree.parents[i]
            first = parent not in seen_parent
            seen_parent.add(parent)
            prob[i] = prob[parent] * self.acceptance.get(tree.depths[i], first)
        # nodes by probability; ties keep tree order, so parents (never less likely) come first
        order = sorted(range(1, len(tree)), key=lambda i: (-prob[i], i))
        best_n, best_rate, expected = 1, None, 1.0
        base = self.cost.estimate(1)
        if base is None:
            return tree  # nothing measured yet: verify the whole proposal once
        best_rate = 1.0 / base
        for k, node in enumerate(order, start=2):
            expected += prob[node]
            cost = self.cost.estimate(k)
            if cost is not None and expected / cost > best_rate:
                best_n, best_rate = k, expected / cost
        if best_n == len(tree):
            return tree
        keep = sorted([0, *order[: best_n - 1]])
        return subtree(tree, keep)

    def observe(self, tree: DraftTree, accepted: tuple[int, ...], verify_ms: float,
                draft_ms: float | None = None, levels: int = 0) -> None:
        """``draft_ms``: the drafting time of a drafted step; None for a step the gate kept plain.
        ``levels``: how many levels the drafter was asked for, when it pays per level (else 0)."""
        self.cost.observe(len(tree), verify_ms)
        self.acceptance.observe(tree, accepted)
        if tree.has_probs:
            self.confidence.observe(tree, accepted)
        if draft_ms is not None:
            judged = self.gate.observe(len(accepted) + 1, draft_ms, verify_ms, self.cost.estimate(1))
            if levels and judged:  # a settling step's catch-up is not the price of its levels
                self.draft_cost.observe(levels, draft_ms)


def subtree(tree: DraftTree, keep: list[int]) -> DraftTree:
    """The nodes ``keep`` (sorted, root first, closed under parents) as a tree of their own."""
    index = {old: new for new, old in enumerate(keep)}
    proposals = None
    if tree.proposals:
        proposals = {index[i]: q for i, q in tree.proposals.items() if i in index}
    return DraftTree(
        tuple(tree.tokens[i] for i in keep),
        tuple(-1 if i == 0 else index[tree.parents[i]] for i in keep),
        tuple(tree.draft_probs[i] for i in keep),
        proposals=proposals,
        has_probs=tree.has_probs,
    )
