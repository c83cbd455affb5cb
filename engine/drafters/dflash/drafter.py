"""The DFlash drafter: one block forward per step, its guesses verified as a chain or, with a tree
width above 1, as a DDTree (engine/drafters/dflash/ddtree.py).

Bookkeeping: the draft KV cache holds one context row per committed token (row p: the target
features of token p at position p, which depend on nothing after p). The features of the tokens
committed since the last block wait in ``_pending`` and join the cache inside the next block's
forward, which runs anyway: a drafted step is one forward of the draft layers over those rows and
the block, whatever the block size or the tree. A shared prefix survives a new turn (``reset``
keeps the rows of the common prefix); nothing is recomputed from the start.

Width 1 (``--speculative-eagle-topk 1``): the block's guesses are a chain through the shared tree
search (engine/drafters/tree_search.py, top-k 1), fed with the rows the one forward computed, so
greedy drafting, coupled sampling (Gumbel-top-1 per position) and rejection sampling (each draft
sampled from its row, the row carried for min(1, p/q)) work as for the other chain drafters.

Width k > 1: each position offers k candidates (its top-k; with coupled sampling its Gumbel-top-k,
the noise of the position the target samples there, ranked by their log-probabilities) and the
tree is the ``num_draft_tokens - 1`` best paths by summed log-probability (DDTree), from the same
forward. Why every sampling rule stays exact:

* greedy and coupled verification walk the tree along the target's own token (its argmax, or its
  sample under the seed's noise, which no draft changes): any tree gives the baseline's tokens;
* rejection sampling verifies the tree's children as point masses (as EAGLE's wider trees): the
  tree is a function of the context alone, drawn from no randomness the verifier uses, and at a
  node with target distribution p, child x is kept with probability p(x), else p(x) is zeroed and
  p renormalised for the next sibling, so the token taken there (a child, or a draw from what is
  left) is distributed as p. That holds whatever chose the children, so marginals read as
  independent change nothing.
* the sampled chain of width 1 carries each position's row q_j as the proposal of its node. q_j is
  what draft j was drawn from, and it stays so given that the drafts before it were accepted:
  the draws are independent of each other and of the verifier's uniforms, and whether the earlier
  drafts pass depends only on those. So min(1, p/q_j) with the residual max(p - q_j, 0) is the
  exact rejection step at every depth, though q_j ignores the drafts before it (a drafter's
  conditional would be better at landing, not more exact).

:meth:`DFlashDrafter.block` is that forward alone, its rows kept in ``last_block`` and the
candidates a tree was grown from in ``last_offers``: what the app shows of a block.

On CUDA the forward is a graph replay (engine/drafters/dflash/graphs.py) and a greedy step's chain
or DDTree is picked inside the same graph (engine/drafters/dflash/device_tree.py for the tree): the
same trees as the host's, read back in one copy. Sampled drafts replay the forward and pick here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import SpecConfig
from engine.drafters.dflash.ddtree import Offers, ddtree
from engine.drafters.dflash.device_tree import ddtree_rows, tree_from_rows
from engine.drafters.dflash.graphs import BlockGraphs, Pick
from engine.drafters.dflash.runner import DFlashRunner
from engine.drafters.draft_loader import Checked, DraftBundle, feature_spec
from engine.drafters.tree_search import (
    Candidates,
    Coupled,
    DraftRandom,
    Level,
    Picks,
    StopRule,
    cancelled,
    check_topk,
    coupled_scores,
    grow_tree,
    to_host,
)
from engine.gpu.graphs import DraftMemory
from engine.models.kv_cache import KVCache
from engine.prefix import common_prefix
from engine.sampling import GumbelNoise
from engine.tree import DraftTree


@dataclass(frozen=True)
class BlockDraft:
    """What one block forward guessed: ``logp`` [rows, vocab] float32 log-probabilities over the
    drafter's vocabulary (``vocab_ids`` maps indices to target ids; None: the target's own), row j
    for the token j + 1 places after the anchor, which sits at ``position``. It is the tree's
    ``block`` (engine/tree.py's BlockRows), so a step can show every position's guesses."""

    position: int
    logp: torch.Tensor
    vocab_ids: torch.Tensor | None = None

    def top(self, k: int) -> list[list[tuple[int, float]]]:
        """Each row's ``k`` most likely target ids and their probabilities, best first (asked only
        where a step's event should carry them: the UI's tree panel and teaching mode)."""
        values, index = self.logp.topk(min(k, self.logp.shape[-1]), dim=-1)
        if self.vocab_ids is not None:
            index = self.vocab_ids[index.to(self.vocab_ids.device)]
        return [list(zip(ids, probs, strict=True))
                for ids, probs in zip(index.tolist(), values.exp().tolist(), strict=True)]


class DFlashDrafter:
    needs_features = True
    pays_per_level = False  # the whole block costs one forward: the budget prunes it, never asks for fewer levels

    def __init__(self, runner: DFlashRunner, name: str) -> None:
        self.runner = runner
        self.name = name
        # the draft cache and the block's graphs, taken over by the next drafter of this runner
        # (engine/gpu/graphs.py, DraftMemory): captured once, not once a conversation
        self.memory: DraftMemory[BlockGraphs] = DraftMemory(runner, runner.new_cache(512))
        self._tokens: list[int] = []  # tokens in the target cache, as far as this drafter knows
        self._pending: list[torch.Tensor] = []  # features of committed tokens without a context row yet
        self._random = DraftRandom()
        self.last_block: BlockDraft | None = None
        self.last_offers: Offers | None = None  # each position's candidates of the last tree (None: a chain)
        # the block forward and the greedy pick as graphs (engine/drafters/dflash/graphs.py) on CUDA
        self.on_device = runner.device.type == "cuda"

    @property
    def cache(self) -> KVCache:
        """The draft KV cache: one context row per committed token (the memory's, where the graphs read it)."""
        return self.memory.cache

    # -- the Drafter protocol ------------------------------------------------------------------
    def check(self, config: SpecConfig) -> None:
        """A tree size past the block drafts the whole block (block_size - 1); a tree width past the
        drafter's vocabulary is refused (a position cannot offer that many distinct tokens)."""
        check_topk(config, self.runner.vocab_size, "DFlash drafter")

    def reset(self, history: Sequence[int], features: torch.Tensor | None = None) -> None:
        """Take ``history`` (tokens in the target cache) and ``features`` (one row per token); the
        context rows of the prefix shared with what the cache holds are kept."""
        history = list(history)
        if features is None or features.shape[0] != len(history):
            raise ValueError("the DFlash drafter needs one target feature per history token")
        keep = min(self.cache.length, common_prefix(self._tokens, history))
        self.cache.truncate(keep)
        self._tokens = history
        self._pending = [features[keep:]]

    def observe(self, committed: Sequence[int], features: torch.Tensor | None = None) -> None:
        if features is None or features.shape[0] != len(committed):
            raise ValueError("the DFlash drafter needs one target feature per committed token")
        self._tokens.extend(committed)
        self._pending.append(features)

    def truncate(self, length: int) -> None:
        """The target cache was cut back to ``length`` tokens: context rows past it go, and so do
        the waiting features of tokens past it."""
        self._tokens = self._tokens[:length]
        if self.cache.length >= length:
            self.cache.truncate(length)
            self._pending = []
            return
        waiting = length - self.cache.length
        self._pending = [torch.cat(self._pending)[:waiting]] if self._pending else []

    def propose(self, history: Sequence[int], root: int, config: SpecConfig, *,
                noise: GumbelNoise | None = None, stop: StopRule | None = None) -> DraftTree:
        """The block's guesses after ``root``, from one forward: a chain of min(num_draft_tokens,
        block_size) - 1 drafts at tree width 1, else the DDTree of num_draft_tokens - 1 nodes over
        that many positions. ``stop`` is asked only for a cancel: the forward is the whole cost, so
        there is no level to save (the budget prunes the tree instead)."""
        if cancelled(stop):
            return DraftTree.root_only(root)
        runner = self.runner
        drafts = min(config.num_draft_tokens, runner.spec.block_size) - 1
        if config.greedy and self.on_device:
            return self._propose_on_device(root, drafts, min(config.tree_width, runner.vocab_size),
                                           config.num_draft_tokens - 1)
        block = self.block(root, drafts)
        coupled = coupled_scores(config, noise, block.position, runner.vocab_ids, runner.kernel)
        width = min(config.tree_width, runner.vocab_size)
        if width > 1:
            self.last_offers = self._offers(block.logp, width, coupled)
            # the block rides on the tree too: the tree panel draws a DDTree with its block's rows
            return dataclasses.replace(ddtree(root, self.last_offers, config.num_draft_tokens - 1), block=block)
        self.last_offers = None  # a chain: no candidates beyond each position's draft
        sampling = self._random.sampling(config, runner.to_target_dist)
        levels = self._levels(block.logp, picked=sampling is None and coupled is None)

        def expand(frontier: list[int], cands: Candidates) -> Level:
            return levels[cands.depth[frontier[0]]]  # a chain: the frontier's child is the next row

        tree, _, _ = grow_tree(root, levels[0], expand, runner.to_target, num_steps=drafts, topk=1,
                               num_draft_tokens=drafts + 1, sampling=sampling, coupled=coupled)
        return dataclasses.replace(tree, block=block)

    def _offers(self, logp: torch.Tensor, k: int, coupled: Coupled | None) -> Offers:
        """Each position's k candidates, ranked by log-probability: its top-k in one operation, or
        with coupled sampling the top-k of its perturbed scores (the noise of the position the
        target samples at; our kernel's picks where it can), so the target's sample is offered
        wherever the drafter gives it a fair chance. One copy to the host either way."""
        rows = logp.shape[0]
        if coupled is not None and coupled.picks is not None:
            first = coupled.picks(logp[:1], 1, k)
            if first is not None:  # the kernel takes every row alike (it declines by settings, not rows)
                picked = [first, *(coupled.picks(logp[j: j + 1], j + 1, k) for j in range(1, rows))]
                return _ranked([p[0][0] for p in picked], [p[1][0] for p in picked])  # type: ignore[index]
        if coupled is None:
            values, index = logp.topk(k, dim=-1)
        else:
            scores = torch.cat([coupled.scores(logp[j: j + 1], j + 1) for j in range(rows)])
            index = scores.topk(k, dim=-1).indices
            values = logp.gather(-1, index)
        ids, flat = to_host(self.runner.to_target(index.flatten()), values.flatten())
        ids_rows, value_rows = [ids[j * k:(j + 1) * k] for j in range(rows)], [flat[j * k:(j + 1) * k]
                                                                               for j in range(rows)]
        return Offers(ids_rows, value_rows) if coupled is None else _ranked(ids_rows, value_rows)

    def _propose_on_device(self, root: int, drafts: int, width: int, budget: int) -> DraftTree:
        """The greedy chain or DDTree as one graph replay and one host read
        (engine/drafters/dflash/graphs.py): the block's per-position argmax, or its top-``width``
        searched on the device (engine/drafters/dflash/device_tree.py); the same tree as the host's.
        ``last_offers`` stays None here: the candidates never leave the device."""
        runner = self.runner
        self.last_offers = None
        if width > 1:
            def pick(logp: torch.Tensor) -> torch.Tensor:
                values, index = logp[:drafts].topk(width, dim=-1)
                return ddtree_rows(runner.to_target(index), values, budget)

            block, rows = self._block_on_device(root, drafts, ("tree", drafts, width, budget), pick)
            return dataclasses.replace(tree_from_rows(root, rows.tolist()), block=block)

        def best(logp: torch.Tensor) -> torch.Tensor:
            values, index = logp[:drafts].max(dim=-1)
            return torch.stack([runner.to_target(index).to(torch.float64), values.to(torch.float64)])

        block, rows = self._block_on_device(root, drafts, ("chain", drafts), best)
        ids, values = rows.tolist()  # the draft's one host wait
        chain = DraftTree((root, *(int(i) for i in ids)), tuple(range(-1, drafts)),
                          (1.0, *(math.exp(v) for v in values)))
        return dataclasses.replace(chain, block=block)

    # -- the block -------------------------------------------------------------------------------
    def block(self, root: int, rows: int) -> BlockDraft:
        """One block forward after ``root``: the waiting context rows join the cache, and the
        log-probabilities of the block's first ``rows`` guesses come back (kept in ``last_block``)."""
        if self.on_device:
            return self._block_on_device(root, rows, ("rows",), lambda logp: logp[:0, 0])[0]
        n = len(self._tokens)
        features = self._waiting()
        features = None if not features else features[0] if len(features) == 1 else torch.cat(features)
        hidden = self.runner.forward(features, self.cache, root)
        self._pending = []
        self.last_block = BlockDraft(n, self.runner.log_probs(hidden[1: rows + 1]), self.runner.vocab_ids)
        return self.last_block

    def _block_on_device(self, root: int, rows: int, key: tuple, pick: Pick) -> tuple[BlockDraft, torch.Tensor]:
        """:meth:`block` replayed from a graph, with ``pick`` of its log-probabilities. Both, and
        ``last_block``'s rows, are the graph's tensors, rewritten by the next block: the step reads
        the block's guesses (engine/step.py, ``block_guesses``) before that, so no copy is paid."""
        n = len(self._tokens)
        if self.memory.graphs is None:
            self.memory.graphs = BlockGraphs(self.runner)
        logp, picked = self.memory.graphs.run(self._waiting(), self.cache, root, key, pick)
        self._pending = []
        self.last_block = BlockDraft(n, logp[:rows], self.runner.vocab_ids)
        return self.last_block, picked

    def _waiting(self) -> list[torch.Tensor]:
        """The waiting features, checked to be one per position without a context row."""
        n, first = len(self._tokens), self.cache.length
        have = sum(f.shape[0] for f in self._pending)
        if have != n - first:
            raise RuntimeError(f"DFlash drafter out of step: {have} features for {n - first} positions")
        return [f for f in self._pending if f.shape[0]]

    def _levels(self, logp: torch.Tensor, *, picked: bool) -> list[Level]:
        """One Level per row; for a plain greedy chain with every row's best child picked in one
        operation (the tree search then reads lists, no torch operation per position)."""
        if not picked:
            return [Level(logp[j: j + 1]) for j in range(logp.shape[0])]
        best, index = logp.max(dim=-1)
        ids, values = self.runner.to_target(index).tolist(), best.tolist()
        return [Level(logp[j: j + 1], Picks([[ids[j]]], [[values[j]]])) for j in range(logp.shape[0])]


def _ranked(ids: list[list[int]], logp: list[list[float]]) -> Offers:
    """Each row's candidates sorted by log-probability, best first (ties keep their order): a
    perturbed top-k is not in that order, and the best-first search needs it."""
    rows = [sorted(zip(v, i, strict=True), key=lambda c: -c[0]) for i, v in zip(ids, logp, strict=True)]
    return Offers([[t for _, t in row] for row in rows], [[v for v, _ in row] for row in rows])


def load_drafter(found: Checked, target: Any, tokenizer: Any) -> DraftBundle:
    """The registration's load: a checked DFlash drafter (engine/drafters/dflash/checkpoint.py) bound
    to ``target``, with the target layers its context reads."""
    spec, weights = found.parts
    runner = DFlashRunner(spec, weights, target)
    vocab = f", {spec.draft_vocab_size} draft tokens" if spec.draft_vocab_size else ""
    what = f"{spec.num_layers} layers, block {spec.block_size}, target layers {list(spec.target_layer_ids)}{vocab}"
    return DraftBundle(found.kind, lambda: DFlashDrafter(runner, found.kind),
                       feature_spec(found.kind, spec.capture_layers), f"DFlash drafter {found.label} ({what})")
