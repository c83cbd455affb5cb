"""What the adaptive budget (engine/adaptive.py) believes about acceptance: the chance that a
drafted node is kept given its parent was, learned online from each verified tree.

Two views, each with its own use: :class:`AcceptanceModel` by the node's place in the tree (depth,
first child or not, contested or not, and whether the last step accepted a run), for drafters
without probabilities (n-gram) and for choosing how deep a drafter should go; and
:class:`ConfidenceModel` by the drafter's own probability for the node (EAGLE-2's observation that a
head's confidence predicts acceptance). Both drift back towards their prior while a key goes
untested, so a pessimistic estimate that stopped its nodes being verified is retried in time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.drafters.tree_search import Candidates
from engine.tree import DraftTree

_PRIOR = 0.5  # optimistic acceptance before any evidence
# the same for a later child, or a contested first child: measured 7-16% on chat and rewrite prompts
# (n-gram), where the optimistic prior they faded back to kept 6-node trees verified that gave 1.8
# tokens for the 2.6 the budget expected (MT-bench n-gram 0.96x -> 1.04x, session 27)
_OTHER_PRIOR = 0.15
_RECOVER = 0.02  # per step, how far an untested estimate drifts back to the prior
_UNLOCK = 0.7  # a first child's estimate this high is where its untested child drifts (_fade_target)
_LEARN = 0.1  # weight of a new observation in the acceptance average
_MAX_DEPTH = 64


@dataclass
class AcceptanceModel:
    """P(node accepted | parent accepted), by depth, first-child-or-not and the last step's run.

    A first child whose parent has other children in the proposal ("contested": an n-gram trie that
    saw several continuations) has its own estimates, by depth and run: on rewrite prompts such a
    child landed 16% of the time at depth 1, an only child 54% (82% within a run), while both were
    one "first child" estimate of ~35% that priced each wrongly (docs/history/benchmarks-sessions.md,
    "Session 27"). Until a contested depth is seen it borrows the first-child estimate, so nothing is
    shut out before it is measured; drafters with their own probabilities are judged by those instead.
    Estimates start from, and fade back to, an optimistic prior for a first child (50%), a lower
    one for the others (15%): a retry is still planned, but not at a price that makes a wide tree
    look worth verifying."""

    rate: dict[tuple[int, bool, bool], float] = field(default_factory=dict)
    contested: dict[tuple[int, bool], float] = field(default_factory=dict)  # (depth, hot)
    hot: bool = False  # the previous step accepted two drafts or more

    def get(self, depth: int, first: bool, contested: bool = False) -> float:
        """Unseen depths borrow the nearest shallower estimate: deep nodes only get tested if
        they are kept, so a fixed pessimistic prior for them would never be corrected."""
        depth = min(depth, _MAX_DEPTH)
        if first and contested:
            for d in range(depth, 0, -1):
                rate = self.contested.get((d, self.hot))
                if rate is not None:
                    return rate
        for d in range(depth, 0, -1):
            rate = self.rate.get((d, first, self.hot))
            if rate is not None:
                return rate
        return _PRIOR if first else _OTHER_PRIOR

    def observe(self, tree: DraftTree, accepted: tuple[int, ...], contested: frozenset[int] = frozenset()) -> None:
        """Record, for every node whose parent was on the accepted path, whether it was kept.
        ``contested``: the nodes of ``tree`` that were contested first children in the proposal."""
        self._record(tree, accepted, contested)
        if len(tree) > 1:
            self.hot = len(accepted) >= 2

    def _record(self, tree: DraftTree, accepted: tuple[int, ...], contested: frozenset[int]) -> None:
        on_path = {0, *accepted}
        seen: set[tuple[int, bool, bool]] = set()
        seen_contested: set[tuple[int, bool]] = set()
        first_child: dict[int, int] = {}
        for i in range(1, len(tree)):
            parent = tree.parents[i]
            first_child.setdefault(parent, i)
            if parent not in on_path:
                continue
            depth, first = min(tree.depths[i], _MAX_DEPTH), first_child[parent] == i
            if first and i in contested:
                key2 = (depth, self.hot)
                old = self.contested.get(key2, self.get(depth, True, True))
                self.contested[key2] = old + _LEARN * ((i in on_path) - old)
                seen_contested.add(key2)
                continue
            key = (depth, first, self.hot)
            old = self.rate.get(key, _PRIOR if first else _OTHER_PRIOR)
            self.rate[key] = old + _LEARN * ((i in on_path) - old)
            seen.add(key)
        for table, fresh in ((self.rate, seen), (self.contested, seen_contested)):
            for k, value in table.items():
                prior = self._fade_target(k) if table is self.rate else _OTHER_PRIOR
                if k not in fresh and value < prior:  # only pessimism fades: confidence waits for evidence
                    table[k] = value + _RECOVER * (prior - value)  # type: ignore[index]

    def _fade_target(self, key: tuple[int, bool, bool]) -> float:
        """Where an untested estimate drifts: its prior, or for a first child deeper than one the
        estimate one level up when that is at least ``_UNLOCK``. Why: a deep node is tested only
        when it is verified, and at the prior (50%) a second draft rarely pays for its share of a
        dearer verify, so one early refusal kept every later step at depth one (rewrite prompts,
        session 28: tau 1.55 in three runs of four, 2.49 in the fourth, the depth-one drafts
        landing 78%). Below the threshold (chat) deeper nodes keep the prior: drifting to any
        higher estimate above cost n-gram ~3% on MT-bench."""
        depth, first, hot = key
        if not first:
            return _OTHER_PRIOR
        above = self.rate.get((depth - 1, True, hot)) if depth > 1 else None
        return above if above is not None and above >= _UNLOCK else _PRIOR


def first_children(tree: DraftTree) -> dict[int, int]:
    """Each parent node's first child (siblings are stored in rank order, so its likeliest)."""
    first: dict[int, int] = {}
    for i in range(1, len(tree)):
        first.setdefault(tree.parents[i], i)
    return first


def first_child_run(tree: DraftTree, accepted: tuple[int, ...]) -> tuple[int, int]:
    """The chain inside a verified tree, the one a top-1 drafter grows (each node's first child, its
    likeliest): (drafts kept along it, drafts tried on it: the kept ones, and the first refused one
    where the chain went on past the last kept)."""
    first = first_children(tree)
    kept, node = 0, 0
    for i in accepted:
        if first.get(node) != i:
            break
        kept, node = kept + 1, i
    return kept, kept + (node in first)


def contested_children(tree: DraftTree) -> frozenset[int]:
    """First children whose parent has other children too, for a drafter without probabilities
    (a drafter that gives its own is judged by them: none are contested)."""
    if tree.has_probs:
        return frozenset()
    children: dict[int, int] = {}
    for i in range(1, len(tree)):
        children[tree.parents[i]] = children.get(tree.parents[i], 0) + 1
    first = first_children(tree)
    return frozenset(first[p] for p, n in children.items() if n > 1)


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
        return self.rate.get(b, self.prior(b))

    @staticmethod
    def prior(b: int) -> float:
        """A bucket's midpoint: the head taken at its word."""
        lo = _CONFIDENCE_EDGES[b - 1] if b else 0.0
        hi = _CONFIDENCE_EDGES[b] if b < len(_CONFIDENCE_EDGES) else 1.0
        return (lo + hi) / 2

    def observe(self, tree: DraftTree, accepted: tuple[int, ...]) -> None:
        """Learn from the nodes whose parent was kept; buckets left untested drift back up to their
        prior, since pruning by this model stops testing the drafts it has come to distrust."""
        on_path = {0, *accepted}
        seen: set[int] = set()
        for i in range(1, len(tree)):
            if tree.parents[i] in on_path:
                b = self.bucket(tree.draft_probs[i])
                old = self.get(tree.draft_probs[i])
                self.rate[b] = old + _LEARN * ((i in on_path) - old)
                seen.add(b)
        for b, value in self.rate.items():
            if b not in seen and value < self.prior(b):
                self.rate[b] = value + _RECOVER * (self.prior(b) - value)

    def path(self, cands: Candidates, i: int) -> float:
        """Estimated probability that candidate ``i`` and all its ancestors are accepted."""
        prob = 1.0
        for a in cands.ancestors(i):
            prob *= self.get(math.exp(cands.logp[a]))
        return prob
