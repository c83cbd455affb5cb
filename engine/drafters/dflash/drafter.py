"""The DFlash drafter: one block forward per step, its guesses verified as a chain.

Bookkeeping: the draft KV cache holds one context row per committed token (row p: the target
features of token p at position p, which depend on nothing after p). The features of the tokens
committed since the last block wait in ``_pending`` and join the cache inside the next block's
forward, which runs anyway: a drafted step is one forward of the draft layers over those rows and
the block, whatever the block size. A shared prefix survives a new turn (``reset`` keeps the rows
of the common prefix); nothing is recomputed from the start.

The block's guesses are a chain through the shared tree search (engine/drafters/tree_search.py,
top-k 1), fed with the rows the one forward computed, so greedy drafting, coupled sampling
(Gumbel-top-1 per position) and rejection sampling (each draft sampled from its row, the row
carried for min(1, p/q)) work as for the other chain drafters. :meth:`DFlashDrafter.block` is
that forward alone, its rows kept in ``last_block``: what a tree built from the block's
per-position top-k (DDTree) starts from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import SpecConfig
from engine.drafters.dflash.runner import DFlashRunner
from engine.drafters.draft_loader import Checked, DraftBundle, feature_spec
from engine.drafters.tree_search import (
    Candidates,
    DraftRandom,
    Level,
    Picks,
    StopRule,
    cancelled,
    coupled_scores,
    grow_tree,
)
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
        self.cache = runner.new_cache(512)
        self._tokens: list[int] = []  # tokens in the target cache, as far as this drafter knows
        self._pending: list[torch.Tensor] = []  # features of committed tokens without a context row yet
        self._random = DraftRandom()
        self.last_block: BlockDraft | None = None

    # -- the Drafter protocol ------------------------------------------------------------------
    def check(self, config: SpecConfig) -> None:
        """Every setting runs: a tree size past the block drafts the whole block (block_size - 1)."""

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
        """The block's guesses after ``root`` as a chain of min(num_draft_tokens, block_size) - 1
        drafts, from one forward. ``stop`` is asked only for a cancel: the forward is the whole cost,
        so there is no level to save (the budget prunes the chain instead)."""
        if cancelled(stop):
            return DraftTree.root_only(root)
        runner = self.runner
        drafts = min(config.num_draft_tokens, runner.spec.block_size) - 1
        block = self.block(root, drafts)
        sampling = self._random.sampling(config, runner.to_target_dist)
        coupled = coupled_scores(config, noise, block.position, runner.vocab_ids, runner.kernel)
        levels = self._levels(block.logp, picked=sampling is None and coupled is None)

        def expand(frontier: list[int], cands: Candidates) -> Level:
            return levels[cands.depth[frontier[0]]]  # a chain: the frontier's child is the next row

        tree, _, _ = grow_tree(root, levels[0], expand, runner.to_target, num_steps=drafts, topk=1,
                               num_draft_tokens=drafts + 1, sampling=sampling, coupled=coupled)
        return dataclasses.replace(tree, block=block)

    # -- the block -------------------------------------------------------------------------------
    def block(self, root: int, rows: int) -> BlockDraft:
        """One block forward after ``root``: the waiting context rows join the cache, and the
        log-probabilities of the block's first ``rows`` guesses come back (kept in ``last_block``)."""
        n = len(self._tokens)
        first = self.cache.length
        have = sum(f.shape[0] for f in self._pending)
        if have != n - first:
            raise RuntimeError(f"DFlash drafter out of step: {have} features for {n - first} positions")
        features = None if not have else self._pending[0] if len(self._pending) == 1 else torch.cat(self._pending)
        hidden = self.runner.forward(features, self.cache, root)
        self._pending = []
        self.last_block = BlockDraft(n, self.runner.log_probs(hidden[1: rows + 1]), self.runner.vocab_ids)
        return self.last_block

    def _levels(self, logp: torch.Tensor, *, picked: bool) -> list[Level]:
        """One Level per row; for a plain greedy chain with every row's best child picked in one
        operation (the tree search then reads lists, no torch operation per position)."""
        if not picked:
            return [Level(logp[j: j + 1]) for j in range(logp.shape[0])]
        best, index = logp.max(dim=-1)
        ids, values = self.runner.to_target(index).tolist(), best.tolist()
        return [Level(logp[j: j + 1], Picks([[ids[j]]], [[values[j]]])) for j in range(logp.shape[0])]


def load_drafter(found: Checked, target: Any, tokenizer: Any) -> DraftBundle:
    """The registration's load: a checked DFlash drafter (engine/drafters/dflash/checkpoint.py) bound
    to ``target``, with the target layers its context reads."""
    spec, weights = found.parts
    runner = DFlashRunner(spec, weights, target)
    vocab = f", {spec.draft_vocab_size} draft tokens" if spec.draft_vocab_size else ""
    what = f"{spec.num_layers} layers, block {spec.block_size}, target layers {list(spec.target_layer_ids)}{vocab}"
    return DraftBundle(found.kind, lambda: DFlashDrafter(runner, found.kind),
                       feature_spec(found.kind, spec.capture_layers), f"DFlash drafter {found.label} ({what})")
