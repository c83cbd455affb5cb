"""DDTree: a draft tree from one DFlash block's per-position distributions, grown best-first.

A block forward (engine/drafters/dflash/drafter.py) gives one distribution per position after the
anchor, each computed without seeing the guesses before it. DDTree (Ringel & Romano, "Accelerating
Speculative Decoding with Block Diffusion Draft Trees") reads them as independent: the score of a
path t_1 .. t_d is log q_1(t_1) + ... + log q_d(t_d), and the tree to verify is the ``budget`` best
paths by that score, which is closed under prefixes (every log-probability is <= 0, so a path never
outscores the path it extends). No drafter forward is spent on the tree: it is a search over numbers
the block already gave.

The search: position j offers its ``width`` candidates (its top-k, best first), and a heap holds
the paths that may come next. It starts with the best candidate of position 1; popping a path keeps
it as a node and pushes its two successors, the same path with its last token swapped for the next
candidate of that position (its next sibling) and the path extended by the best candidate of the
next position (its first child). Every path has exactly one predecessor of that kind (its previous
sibling, or for a first candidate its parent), whose key is smaller, so paths leave the heap in the
order of their keys: the popped ones are the ``budget`` best of all paths, found in
O(budget log budget) without scoring the width ** depth paths there are.

Keys: (-score, ranks), ``ranks`` the path's candidate indices. Ties in score go to the smaller rank
tuple, which a path's prefix always is, so parents come before children and siblings in rank order:
the tree is stored in pop order, topological, each node's first child its likeliest
(tests/test_ddtree.py checks the result against a brute-force enumeration).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.tree import DraftTree


@dataclass(frozen=True)
class Offers:
    """Each position's candidates, best first: ``ids[j]`` target token ids, ``logp[j]`` their
    log-probabilities (non-increasing along the row), row j for the token j + 1 places after the root."""

    ids: Sequence[Sequence[int]]
    logp: Sequence[Sequence[float]]


def best_paths(logp: Sequence[Sequence[float]], budget: int) -> list[tuple[int, ...]]:
    """The ``budget`` best paths (tuples of candidate ranks, one per position from the first) by
    summed log-probability, in key order (see the module docstring)."""
    if budget <= 0 or not logp or not logp[0]:
        return []
    out: list[tuple[int, ...]] = []
    # (-score, ranks, -score of the parent path): each score is the parent's plus one term, summed
    # from the root down, so a path's score is the same float however the search reached it
    heap: list[tuple[float, tuple[int, ...], float]] = [(0.0 - logp[0][0], (0,), 0.0)]
    while heap and len(out) < budget:
        neg, ranks, base = heapq.heappop(heap)
        out.append(ranks)
        depth, rank = len(ranks) - 1, ranks[-1]
        if rank + 1 < len(logp[depth]):  # the next sibling: the last token swapped for the next candidate
            heapq.heappush(heap, (base - logp[depth][rank + 1], (*ranks[:-1], rank + 1), base))
        if depth + 1 < len(logp):  # the first child: one position further, its best candidate
            heapq.heappush(heap, (neg - logp[depth + 1][0], (*ranks, 0), neg))
    return out


def ddtree(root: int, offers: Offers, budget: int) -> DraftTree:
    """The draft tree of the ``budget`` best paths over ``offers`` (the root not counted); each
    node's draft probability is its position's probability of its token."""
    paths = best_paths(offers.logp, budget)
    node = {(): 0}
    tokens, parents, probs = [root], [-1], [1.0]
    for ranks in paths:
        depth, rank = len(ranks) - 1, ranks[-1]
        node[ranks] = len(tokens)
        tokens.append(offers.ids[depth][rank])
        parents.append(node[ranks[:-1]])
        probs.append(math.exp(offers.logp[depth][rank]))
    return DraftTree(tuple(tokens), tuple(parents), tuple(probs))
