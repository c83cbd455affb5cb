"""EAGLE-2's dynamic draft tree, shared by the EAGLE heads and the standalone draft model.

The tree grows level by level: the root's top-k children form level 1; each further level feeds
the current frontier (k nodes) through the drafter in one batched forward, takes the top-k
children of every frontier node (k² candidates scored by cumulative draft log-probability) and
keeps the k best as the next frontier. Finally the best ``num_draft_tokens - 1`` of *all*
candidates are verified.

SGLang's knobs keep their meaning: ``num_steps`` is the number of levels (the first comes from
the root's own output, so ``num_steps - 1`` tree forwards), ``tree_width`` (SGLang's ``eagle_topk``)
the branching, and ``num_draft_tokens`` the tree size with the root. ``topk 1`` is a chain of ``num_steps`` drafts.

With coupled sampling (temperature > 0, the default; engine/sampling.py) the children of a node
are the top-k of the drafter's processed log-probabilities plus the Gumbel noise the target will
use at that position (Gumbel-top-k: a sample without replacement from q), so a good drafter
proposes the very token the target is about to sample. Cumulative scores stay plain
log-probabilities, which keeps selection closed under parents.

With rejection sampling and ``topk 1``, each draft is *sampled* from the drafter's
distribution processed like the target's (temperature, top-k, top-p), and that distribution
travels with the tree (``DraftTree.proposals``) so verification can accept with min(1, p/q):
far more acceptances than treating an argmax draft as a point mass when the drafter is good.
Wider trees stay deterministic top-k, verified as point masses (both lossless).

A drafter that computes its log-probabilities in our native kernel also hands over each row's best
children there (:class:`Level`'s ``picks``), and the greedy search takes them as plain lists: on the
CPU each torch operation between two levels costs ~15-20 us with the caches cold after the target's
forward, several times the level's arithmetic of picking.

Selection is closed under parents by construction: a child's cumulative score never exceeds its
parent's (log-probabilities are <= 0 and float addition is monotonic), and ties go to the lower
candidate index, which a parent always has.
"""

from __future__ import annotations

import math
import random
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.config import ConfigError, SpecConfig
from engine.sampling import GumbelNoise, perturbed_scores, target_probs
from engine.tree import DraftTree
from engine.verify import draw


@dataclass
class Candidates:
    """Every node the search scored, in creation order (a topological order)."""

    tokens: list[int] = field(default_factory=list)  # target token ids
    logp: list[float] = field(default_factory=list)  # log-probability given the parent
    score: list[float] = field(default_factory=list)  # cumulative log-probability from the root
    parent: list[int] = field(default_factory=list)  # candidate index, -1 = the root
    depth: list[int] = field(default_factory=list)

    def add(self, tokens: list[int], logp: list[float], score: list[float], parent: list[int], depth: int
            ) -> list[int]:
        first = len(self.tokens)
        self.tokens += tokens
        self.logp += logp
        self.score += score
        self.parent += parent
        self.depth += [depth] * len(tokens)
        return list(range(first, len(self.tokens)))

    def ancestors(self, i: int) -> list[int]:
        """Candidate indices from ``i``'s depth-1 ancestor down to ``i`` itself."""
        out = []
        while i >= 0:
            out.append(i)
            i = self.parent[i]
        return out[::-1]


@dataclass(frozen=True)
class Picks:
    """Each row's best children, best first (ties to the lower index), as target ids and their
    log-probabilities: what a greedy level keeps, read without a torch operation."""

    ids: list[list[int]]
    logp: list[list[float]]


@dataclass(frozen=True)
class Level:
    """A level's log-probabilities [rows, vocab], and where the drafter picked them already, the best
    children of each row (at least the top-k the search asked the drafter for)."""

    logp: torch.Tensor
    picks: Picks | None = None


# expand(frontier candidate indices) -> [len(frontier), vocab] log-probs of their children
Expand = Callable[[list[int], Candidates], "torch.Tensor | Level"]
# head vocabulary indices -> target token ids
ToTarget = Callable[[torch.Tensor], torch.Tensor]
# (candidates, frontier) -> True when another level is not worth a drafter forward (the adaptive
# budget's confidence rule, engine/adaptive.py); the levels already drafted are kept
StopRule = Callable[[Candidates, list[int]], bool]
# [f, head vocab] log-probs -> [f, head vocab] the distribution to sample drafts from
Processor = Callable[[torch.Tensor], torch.Tensor]
# [head vocab] distribution -> [target vocab] distribution
ToTargetDist = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Coupled:
    """Coupled sampling: ``scores(logp rows, child depth)`` -> perturbed scores to take the top-k of;
    ``picks(logp rows, child depth, k)``, where our kernel can, the same top-k as (ids, log-probs)
    lists per row, or None where it cannot (then the scores are used)."""

    scores: Callable[[torch.Tensor, int], torch.Tensor]
    picks: Callable[[torch.Tensor, int, int], tuple[list[list[int]], list[list[float]]] | None] | None = None


@dataclass
class Sampling:
    """How a chain drafter samples (temperature > 0): see the module docstring."""

    process: Processor
    to_target_dist: ToTargetDist
    generator: torch.Generator | None = None


@dataclass(frozen=True)
class Cancellable:
    """``rule``, and a stop once ``cancel`` is set: every drafter that grows a tree level by level
    asks before each level, so Esc waits for at most one level (and the verify of what was grown),
    not for the 32 levels the largest settings draft. A search that reads nothing between levels
    (engine/drafters/eagle_graphs.py) asks once, before the tree: :func:`levels_on_device`."""

    rule: StopRule | None
    cancel: threading.Event

    def __call__(self, cands: Candidates, frontier: list[int]) -> bool:
        return self.cancel.is_set() or (self.rule is not None and self.rule(cands, frontier))


def cancellable(rule: StopRule | None, cancel: threading.Event) -> StopRule:
    return Cancellable(rule, cancel)


def levels_on_device(stop: StopRule | None) -> bool:
    """Whether a search that reads nothing between levels may run under ``stop``: there is none,
    or it is the session's (:class:`Cancellable`). Its cancel is checked before the tree
    (:func:`cancelled`); its rule, the adaptive budget's per-level stop, is not asked: on the
    device the budget's say is the depth and width it picks before the step (engine/step.py) and the
    pruning after. Asking it would read the candidates back every level (a host wait each) to save
    a level that a graph replays in microseconds; the answer is the same either way (the budget
    only prunes drafts)."""
    return stop is None or isinstance(stop, Cancellable)


def cancelled(stop: StopRule | None) -> bool:
    """A cancel seen now (before a tree's first level)."""
    return isinstance(stop, Cancellable) and stop.cancel.is_set()


_KERNEL_MAX_K = 64  # the widest top-k the kernel's perturbed picks take (ops.c)


def grow_tree(root: int, root_logp: torch.Tensor | Level, expand: Expand, to_target: ToTarget, *,
              num_steps: int, topk: int, num_draft_tokens: int, sampling: Sampling | None = None,
              coupled: Coupled | None = None, stop: StopRule | None = None
              ) -> tuple[DraftTree, Candidates, list[int]]:
    """Build one step's tree. Returns (tree, all candidates, the candidate index of each tree node
    after the root) so drafters can map tree nodes back to their own state.

    ``stop`` is asked before each further level whether the frontier is still worth a forward
    (EAGLE-2's observation: a drafter's own path probability predicts acceptance, so a branch
    whose probability is already low is not grown); without it all ``num_steps`` levels grow.
    ``root_logp``: the root's children, [vocab] or a one-row :class:`Level`."""
    first = root_logp if isinstance(root_logp, Level) else Level(root_logp[None])
    k = min(topk, first.logp.shape[-1])
    budget = num_draft_tokens - 1
    cands = Candidates()
    if budget <= 0:
        return DraftTree.root_only(root), cands, []
    sampled = sampling is not None and k == 1
    proposals: dict[int, torch.Tensor] = {}  # candidate index (-1 = root) -> q its child came from
    picked = None if sampled else _picked(first, k, coupled, 1)
    if picked is None:
        lp, ix = _pick(first.logp, k, sampling if sampled else None, [-1], proposals, coupled, 1)
        picked = to_host(to_target(ix[0]), lp[0])
    ids, lp_list = picked
    frontier = cands.add(ids, lp_list, lp_list, [-1] * k, 1)
    for level in range(2, num_steps + 1):
        if stop is not None and stop(cands, frontier):
            break
        out = expand(frontier, cands)
        grown = out if isinstance(out, Level) else Level(out)  # [f, vocab]
        picked = None if sampled else _picked(grown, k, coupled, level)
        if picked is not None:  # the drafter's own picks; each sum rounded as float32, as below
            ids, lp_list = picked
            cum_list = [_f32(cands.score[p] + v) for p, v in zip((p for p in frontier for _ in range(k)), lp_list,
                                                                 strict=True)]
        else:
            lp, ix = _pick(grown.logp, k, sampling if sampled else None, frontier, proposals, coupled, level)  # [f, k]
            # on lp's device: a GPU drafter's log-probs cannot be added to a host tensor
            parent_scores = torch.tensor([cands.score[i] for i in frontier], dtype=lp.dtype).to(lp.device,
                                                                                                non_blocking=True)
            cum = parent_scores[:, None] + lp
            ids, lp_list, cum_list = to_host(to_target(ix.flatten()), lp.flatten(), cum.flatten())
        new = cands.add(ids, lp_list, cum_list, [p for p in frontier for _ in range(k)], level)
        frontier = _best(new, cands.score, k)
    chosen = sorted(_best(list(range(len(cands.tokens))), cands.score, budget))
    row = {c: r for r, c in enumerate(chosen, start=1)}
    row[-1] = 0
    parents = tuple([-1] + [row[cands.parent[c]] for c in chosen])
    tree = DraftTree(
        (root, *(cands.tokens[c] for c in chosen)),
        parents,
        (1.0, *(math.exp(cands.logp[c]) for c in chosen)),
        proposals={row[c]: q for c, q in proposals.items() if c in row} if sampled else None,
    )
    return tree, cands, chosen


def _pick(logp: torch.Tensor, k: int, sampling: Sampling | None, owners: list[int],
          proposals: dict[int, torch.Tensor], coupled: Coupled | None = None, depth: int = 1
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Children of each row: the top-k; with coupled sampling the top-k of the perturbed scores;
    or (rejection sampling, k = 1) one draw from the processed distribution, recorded in
    ``proposals`` under the row's owner."""
    if coupled is not None:
        ix = coupled.scores(logp, depth).topk(k, dim=-1).indices
        return logp.gather(-1, ix), ix
    if sampling is None:
        if k == 1:  # a chain: the argmax (first of equals), cheaper than a top-k
            return logp.max(dim=-1, keepdim=True)
        return logp.topk(k, dim=-1)
    q = sampling.process(logp)
    ix = draw(q, sampling.generator)  # [f, 1], on q's device
    for owner, row in zip(owners, q, strict=True):
        proposals[owner] = sampling.to_target_dist(row)
    return logp.gather(-1, ix), ix


def _picked(level: Level, k: int, coupled: Coupled | None, depth: int) -> tuple[list[int], list[float]] | None:
    """Each row's k children as flat (target ids, log-probabilities) lists without a torch operation:
    the drafter's own picks for a plain top-k, the kernel's perturbed top-k when coupled; None where
    neither is at hand (the caller then takes the tensor path)."""
    if coupled is not None:
        got = coupled.picks(level.logp, depth, k) if coupled.picks is not None else None
        ids, logp = got if got is not None else (None, None)
    else:
        ids, logp = (level.picks.ids, level.picks.logp) if level.picks is not None else (None, None)
    if ids is None or logp is None or any(len(row) < k for row in ids):
        return None
    return [i for row in ids for i in row[:k]], [v for row in logp for v in row[:k]]


def _f32(x: float) -> float:
    """``x`` rounded to float32: what the tensor path's float32 sum of two float32 scores gives."""
    return struct.unpack("f", struct.pack("f", x))[0]


def to_host(ids: torch.Tensor, *values: torch.Tensor) -> tuple[list, ...]:
    """Token ids and float rows as Python lists in one device-to-host copy: on a GPU each
    ``.tolist()`` waits for the queue to drain, and a level needed three. float64 holds every id
    and every float32/bf16 value exactly, so the lists equal the separate ``.tolist()`` ones.
    On the host there is no copy to save, and the stacking cost 12 us a level against 1."""
    if ids.device.type == "cpu":
        return (ids.tolist(), *(v.tolist() for v in values))
    rows = torch.stack([ids.to(torch.float64), *(v.to(torch.float64) for v in values)]).tolist()
    return ([int(i) for i in rows[0]], *rows[1:])


def _best(indices: list[int], score: list[float], n: int) -> list[int]:
    """The ``n`` best candidates by score, ties to the lower index (so parents before children)."""
    return sorted(indices, key=lambda i: (-score[i], i))[:n]


class DraftRandom:
    """The drafter's own random stream, reseeded when the configured seed changes, so seeded
    runs reproduce (drafting draws from it, verification from the session's)."""

    _UNSET = object()

    def __init__(self) -> None:
        self._seed: object = self._UNSET
        self.generator = torch.Generator()

    def sampling(self, config: SpecConfig, to_target_dist: ToTargetDist) -> Sampling | None:
        """Rejection sampling's draft distribution (None when greedy or coupled)."""
        if config.greedy or config.sampling == "coupled":
            return None
        if config.seed != self._seed:
            self.generator.manual_seed(config.seed if config.seed is not None else random.getrandbits(63))
            self._seed = config.seed

        def process(logp: torch.Tensor) -> torch.Tensor:
            return target_probs(logp, config.temperature, config.top_p, config.top_k)

        return Sampling(process, to_target_dist, self.generator)


def coupled_scores(config: SpecConfig, noise: GumbelNoise | None, first_position: int, head_ids: torch.Tensor | None,
                   kernel: Any = None) -> Coupled | None:
    """Coupled drafting for a tree whose depth-d children sit at ``first_position + d``.

    ``noise``: the session's engine.sampling.GumbelNoise (None: not coupled). ``head_ids``: the
    target id of each drafter vocabulary index (None when they coincide). ``kernel``: our native
    kernel where the drafter's log-probabilities are host tensors: without top-k or top-p processing
    it picks the children itself (``NativeKernel.perturbed_topk``)."""
    if noise is None or config.greedy:
        return None

    def scores(logp: torch.Tensor, depth: int) -> torch.Tensor:
        g = noise.at(first_position + depth)
        g = g[head_ids.to(g.device)] if head_ids is not None else g[: logp.shape[-1]]
        return perturbed_scores(logp, config.temperature, config.top_p, config.top_k, g)

    def picks(logp: torch.Tensor, depth: int, k: int) -> tuple[list[list[int]], list[list[float]]] | None:
        if 0 < config.top_k < logp.shape[-1] or k > _KERNEL_MAX_K or logp.device.type != "cpu":
            return None  # processed, too wide, or on a device: the tensor path
        return kernel.perturbed_topk(logp.contiguous(), k, config.temperature, noise.at(first_position + depth),
                                     head_ids)

    plain = config.top_p >= 1.0 and kernel is not None
    return Coupled(scores, picks if plain else None)


def check_topk(config: SpecConfig, vocab_size: int, drafter: str) -> None:
    """Refuse a branching wider than the drafter's vocabulary: a level could not hold that many
    distinct children, and each further level would score top-k squared candidates for nothing."""
    if config.tree_width > vocab_size:
        raise ConfigError(f"eagle_topk={config.eagle_topk} is more than the {drafter}'s vocabulary of "
                          f"{vocab_size} tokens; use eagle_topk {vocab_size} or less")
