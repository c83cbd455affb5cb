"""EAGLE-2's greedy tree search with every level on the device and one host read per tree.

engine/drafters/tree_search.py grows the tree on the host: each level's candidates come back as
lists (a ``.tolist()``), the frontier is chosen in Python, and the next level's inputs go over
again. On a GPU each of those reads drains the queue, so a tree of ``num_steps`` levels waited
``num_steps`` times. Here the candidates stay device tensors from the root's children to the
chosen tree: each level takes every frontier row's top-k children, adds the parents' scores, and
keeps the k best (a stable sort, so ties go to the lower candidate index, as on the host); the
tree's nodes are the best ``num_draft_tokens - 1`` of all candidates, read back in one copy.

Shapes depend only on (topk, level), never on the drafted values: a level is ``k`` rows, its
head-cache slots are fixed by the level, and each row's ancestors are a [k, levels * k] boolean
mask gathered from its parent's row. That is what makes a level replayable as a CUDA graph.

Greedy only (plain top-k): sampled and coupled drafts keep the host search. The adaptive budget's
per-level stop rule is not asked here (tree_search.levels_on_device says why); a cancel is seen
before the tree. engine/drafters/eagle_graphs.py replays the whole search from one CUDA graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.tree import DraftTree


@dataclass
class Frontier:
    """The rows a level expands, all on the device: ``tokens`` [k] target ids; ``parent_rows`` [k]
    each row's parent among the previous level's rows (None at depth 1: the root is every
    row's parent); ``depth`` of its nodes."""

    tokens: torch.Tensor
    parent_rows: torch.Tensor | None
    depth: int


# (frontier) -> [k, head vocab] log-probabilities of each row's children
ExpandOnDevice = Callable[[Frontier], torch.Tensor]
ToTarget = Callable[[torch.Tensor], torch.Tensor]


def _best(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the ``n`` best scores, best first, ties to the lower index (as tree_search._best)."""
    return torch.sort(scores, descending=True, stable=True).indices[:n]


def grow_tree_on_device(root: int, root_logp: torch.Tensor, expand: ExpandOnDevice, to_target: ToTarget, *,
                        num_steps: int, topk: int, num_draft_tokens: int) -> DraftTree:
    """The greedy tree of tree_search.grow_tree (same knobs), searched on ``root_logp``'s device.
    ``root_logp``: [head vocab] log-probabilities of the root's children."""
    if num_draft_tokens <= 1:
        return DraftTree.root_only(root)
    return tree_from_rows(root, search_on_device(root_logp, expand, to_target, num_steps=num_steps, topk=topk,
                                                 num_draft_tokens=num_draft_tokens).tolist())


def search_on_device(root_logp: torch.Tensor, expand: ExpandOnDevice, to_target: ToTarget, *, num_steps: int,
                     topk: int, num_draft_tokens: int) -> torch.Tensor:
    """The search with nothing read back: [4, num_draft_tokens - 1] float64 rows (the chosen nodes'
    target ids, their parents' candidate indices (-1: the root), their log-probabilities, their own
    candidate indices), which :func:`tree_from_rows` turns into the tree after one read. float64
    holds every id and float32 value exactly. No shape or host value depends on the drafted values,
    so a CUDA graph can hold the whole search (engine/drafters/eagle_graphs.py)."""
    budget = num_draft_tokens - 1
    k = min(topk, root_logp.shape[-1])
    lp, ix = root_logp.float().topk(k)
    tokens, logp, score = [to_target(ix)], [lp], [lp]
    parent = [torch.full((k,), -1, dtype=torch.int64, device=lp.device)]
    frontier_idx = torch.arange(k, device=lp.device)  # candidate indices of the frontier
    frontier = Frontier(tokens[0], None, 1)
    frontier_score = lp
    first = 0  # candidate index of the frontier's level's first node
    for level in range(2, num_steps + 1):
        grown = expand(frontier).float()  # [k, vocab]
        lp, ix = grown.topk(k, dim=-1)  # [k rows, k children]
        cum = (frontier_score[:, None] + lp).flatten()
        first += tokens[-1].shape[0]
        tokens.append(to_target(ix.flatten()))
        logp.append(lp.flatten())
        score.append(cum)
        parent.append(frontier_idx[:, None].expand(-1, k).flatten())  # each row's k children
        keep = _best(cum, k)  # positions among this level's k * k: row keep // k's child
        frontier_idx = first + keep
        frontier_score = cum[keep]
        frontier = Frontier(tokens[-1][keep], keep // k, level)
    chosen = _best(torch.cat(score), budget).sort().values
    rows = (torch.cat(tokens)[chosen], torch.cat(parent)[chosen], torch.cat(logp)[chosen], chosen)
    return torch.stack([r.to(torch.float64) for r in rows])


def tree_from_rows(root: int, rows: list[list[float]]) -> DraftTree:
    """The DraftTree of :func:`search_on_device`'s rows, read back as lists."""
    ids, parents, lps, chosen = rows
    row = {int(c): r for r, c in enumerate(chosen, start=1)}
    row[-1] = 0
    return DraftTree((root, *(int(i) for i in ids)), (-1, *(row[int(p)] for p in parents)),
                     (1.0, *(math.exp(v) for v in lps)))
