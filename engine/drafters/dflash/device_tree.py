"""DDTree's best-first search on the device: the tree of engine/drafters/dflash/ddtree.py with no
host read per node, so a CUDA graph can hold it with the block forward (engine/drafters/dflash/graphs.py).

The host heap pops one path at a time, and each pop decides what is pushed next: a loop whose
length and branches depend on the values. Here the same ``budget`` best paths come from a fixed
sequence of sorts, one level (position) at a time:

* The best ``budget`` paths are closed under prefixes (every log-probability is <= 0 and a prefix
  is the smaller rank tuple), so the ones of depth d extend the ones of depth d - 1 that are among
  the ``budget`` best *of their depth*. A level therefore keeps the ``budget`` best of its depth
  (or all of them, when fewer exist): every child of the previous level's kept paths, scored and
  cut to that size. The sizes depend on (depth, width, budget) alone.
* Keys are the heap's, (-score, ranks) with ranks compared as tuples. A level's kept paths are
  stored in tuple order, so its children, listed parent by parent and rank by rank, are too, and a
  stable sort by score keeps ties in tuple order. Across levels the tuple order is recovered by a
  stable sort per position, last position first, on the ranks padded with -1 (a prefix sorts before
  its extensions); one stable sort by score then gives the heap's pop order, of which the first
  ``budget`` are the tree.
* Scores are summed from the root down in float64 starting at +0.0, the heap's sums negated (so the
  same floats, and never a -0.0 that a radix sort would order apart).

tests/gpu/test_gpu_dflash.py checks it against the heap (hypothesis, with ties) and replays it from a graph.
"""

from __future__ import annotations

import math

import torch

from engine.tree import DraftTree


def level_sizes(depth: int, width: int, budget: int) -> list[int]:
    """Paths kept per depth: the ``budget`` best of that depth, or every one when fewer exist."""
    sizes, kept = [], 1
    for _ in range(depth if budget > 0 and width > 0 else 0):
        kept = min(budget, kept * width)
        sizes.append(kept)
    return sizes


def ddtree_rows(ids: torch.Tensor, logp: torch.Tensor, budget: int) -> torch.Tensor:
    """[3, min(budget, every path)] float64 rows of the tree's nodes in the heap's pop order: each
    node's token id, its parent's node index (0: the root) and its log-probability. ``ids``,
    ``logp``: [depth, width] each position's candidates, best first (a top-k). float64 holds every
    id and float32 value exactly; nothing is read back here."""
    depth, width = logp.shape
    dev = logp.device
    values = logp.to(torch.float64)
    ranks = torch.full((1, depth), -1, dtype=torch.int64, device=dev)  # the root's (empty) path
    score = torch.zeros(1, dtype=torch.float64, device=dev)
    kept_ranks, kept_score, kept_parent = [], [], []
    above = total = 0  # the previous level's first path and the paths kept so far, as global indices
    for d, size in enumerate(level_sizes(depth, width, budget)):
        children = (score[:, None] + values[d][None, :]).flatten()  # tuple order: parent-major, rank-minor
        best = torch.sort(children, descending=True, stable=True).indices[:size].sort().values
        rows = best // width
        ranks = ranks[rows].clone()
        ranks[:, d] = best % width
        score = children[best]
        kept_ranks.append(ranks)
        kept_score.append(score)
        kept_parent.append(rows + above if d else torch.full((size,), -1, dtype=torch.int64, device=dev))
        above, total = total, total + size
    if not kept_ranks:
        return torch.zeros(3, 0, dtype=torch.float64, device=dev)
    return _pop_order(torch.cat(kept_ranks), torch.cat(kept_score), torch.cat(kept_parent), ids, logp, budget)


def _pop_order(ranks: torch.Tensor, score: torch.Tensor, parent: torch.Tensor, ids: torch.Tensor,
               logp: torch.Tensor, budget: int) -> torch.Tensor:
    """The first ``budget`` kept paths by (-score, ranks) as :func:`ddtree_rows`' rows."""
    n, depth = ranks.shape
    order = torch.arange(n, device=ranks.device)
    for col in reversed(range(depth)):  # tuple order, least significant position first
        order = order[torch.sort(ranks[order, col], stable=True).indices]
    order = order[torch.sort(score[order], descending=True, stable=True).indices][:budget]
    node = torch.zeros(n, dtype=torch.int64, device=ranks.device)
    node[order] = torch.arange(1, order.shape[0] + 1, device=ranks.device)  # kept path -> tree node
    chosen = ranks[order]
    at = (chosen >= 0).sum(dim=1) - 1  # each node's position (depth - 1)
    rank = chosen.gather(1, at[:, None])[:, 0]
    up = parent[order]
    parents = node[up.clamp(min=0)].masked_fill_(up < 0, 0)  # 0: the root
    return torch.stack([ids[at, rank].to(torch.float64), parents.to(torch.float64), logp[at, rank].to(torch.float64)])


def tree_from_rows(root: int, rows: list[list[float]]) -> DraftTree:
    """The DraftTree of :func:`ddtree_rows`' rows read back as lists (ddtree.ddtree's tree)."""
    ids, parents, lps = rows
    return DraftTree((root, *(int(i) for i in ids)), (-1, *(int(p) for p in parents)),
                     (1.0, *(math.exp(v) for v in lps)))
