"""The EAGLE drafter (EAGLE-2 dynamic trees over an EAGLE-1/2 or EAGLE-3 head).

Bookkeeping follows the reference: the head's cache holds one entry per *committed* position p,
made of the token at p+1 and the target feature at p, at RoPE position p. Each step:

1. extend: entries for the positions committed since the last step (the root's is the last one,
   which is why entries are built in ``propose``, once the root is known);
2. grow the tree from the last entry's output (engine.drafters.tree_search); a node at depth d
   sits at position N-1+d, reads its parent's output as its stream and attends to the committed
   entries plus its own ancestors' scratch entries — never a sibling's;
3. scratch entries are dropped: the next extend overwrites them.

Features come from the session (the target's verify forward already computes them), so the
drafter never runs the target itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.config import SpecConfig
from engine.drafters.draft_loader import Checked, DraftBundle, feature_spec
from engine.drafters.eagle_checkpoint import kind_label
from engine.drafters.eagle_graphs import EagleDraftGraphs
from engine.drafters.eagle_head import EagleHead
from engine.drafters.tree_search import (
    Candidates,
    DraftRandom,
    Level,
    StopRule,
    cancelled,
    check_topk,
    coupled_scores,
    grow_tree,
    levels_on_device,
)
from engine.gpu.graphs import DraftMemory
from engine.kernels.eagle_native import Keys
from engine.methods import chain_size
from engine.models.kv_cache import KVCache
from engine.prefix import common_prefix
from engine.sampling import GumbelNoise
from engine.tree import DraftTree


class EagleDrafter:
    needs_features = True
    pays_per_level = True

    def __init__(self, head: EagleHead, name: str | None = None) -> None:
        self.head = head
        self.name = name or head.spec.kind
        # the head's cache and the draft's graphs, taken over by the next drafter of this head
        # (engine/gpu/graphs.py, DraftMemory): captured once, not once a conversation
        self.memory: DraftMemory[EagleDraftGraphs] = DraftMemory(head, head.new_cache(512))
        self._tokens: list[int] = []  # tokens in the target cache, as far as this drafter knows
        self._pending: list[torch.Tensor] = []  # features of committed positions without a head entry yet
        self._random = DraftRandom()
        # the greedy draft as graphs (engine/drafters/eagle_graphs.py) where the per-op head runs on
        # CUDA; tests set it on the CPU, where the same bodies run eagerly
        self.on_device = head.native is None and head.device.type == "cuda"

    @property
    def cache(self) -> KVCache:
        """The head's KV cache: one entry per committed position (the memory's, where the graphs read it)."""
        return self.memory.cache

    @property
    def graphs(self) -> EagleDraftGraphs:
        """The draft's graphs, made on the first on-device draft."""
        if self.memory.graphs is None:
            self.memory.graphs = EagleDraftGraphs(self.head)
        return self.memory.graphs

    # -- the Drafter protocol ------------------------------------------------------------------
    def check(self, config: SpecConfig) -> None:
        check_topk(config, self.head.vocab_size, "draft head")

    def reset(self, history: Sequence[int], features: torch.Tensor | None = None) -> None:
        """Take ``history`` (tokens in the target cache) and ``features`` (one row per token).

        Entries built for a shared prefix are kept: entry p depends on tokens up to p+1, so
        with a common prefix of c tokens the first c-1 entries are still right.
        """
        history = list(history)
        if features is None or features.shape[0] != len(history):
            raise ValueError("the EAGLE drafter needs one target feature per history token")
        keep = min(self.cache.length, max(common_prefix(self._tokens, history) - 1, 0))
        self.cache.truncate(keep)
        self._tokens = history
        self._pending = [features[keep:]]

    def observe(self, committed: Sequence[int], features: torch.Tensor | None = None) -> None:
        if features is None or features.shape[0] != len(committed):
            raise ValueError("the EAGLE drafter needs one target feature per committed token")
        self._tokens.extend(committed)
        self._pending.append(features)

    def truncate(self, length: int) -> None:
        """The target cache was cut back to ``length`` tokens: forget everything; the session's
        next ``reset`` brings the history and its features back."""
        self._tokens = []
        self._pending = []
        self.cache.truncate(0)

    def propose(self, history: Sequence[int], root: int, config: SpecConfig, *,
                noise: GumbelNoise | None = None, stop: StopRule | None = None) -> DraftTree:
        head = self.head
        n = len(self._tokens)
        steps, topk = config.num_steps, config.tree_width
        budget = min(config.num_draft_tokens, chain_size(steps)) if topk == 1 else config.num_draft_tokens
        sampling = self._random.sampling(config, head.to_target_dist)
        coupled = coupled_scores(config, noise, n, head.vocab_ids, head.kernel)
        if sampling is None and coupled is None and self.on_device and levels_on_device(stop):
            return self._propose_on_device(root, steps, topk, 1 if cancelled(stop) else budget)
        picks = topk if sampling is None and coupled is None else 0  # plain top-k: the kernel picks
        g_last, root_logp = self._extend(root, picks)
        state: dict[int, torch.Tensor] = {}
        slots: dict[int, int] = {}

        def expand(frontier: list[int], cands: Candidates) -> Level:
            start = n + len(slots)
            for j, i in enumerate(frontier):
                slots[i] = start + j
            # each node sees the committed entries, then its ancestors and itself (never a sibling)
            keys = Keys.build([n] * len(frontier), [[slots[a] for a in cands.ancestors(i)] for i in frontier])
            # tokens and positions as lists (EagleHead.run says why); a chain's one row as a view
            rows = [state.get(cands.parent[i], g_last) for i in frontier]
            stream = rows[0][None] if len(rows) == 1 else torch.stack(rows)
            g, level = head.run([cands.tokens[i] for i in frontier], stream, [n - 1 + cands.depth[i] for i in frontier],
                                self.cache, start, keys, logits=len(frontier), picks=picks)
            for row, i in enumerate(frontier):
                state[i] = g[row]
            assert level is not None
            return level

        tree, _, _ = grow_tree(root, root_logp, expand, head.to_target, num_steps=steps, topk=topk,
                               num_draft_tokens=budget,
                               sampling=sampling, coupled=coupled, stop=stop)
        return tree

    # -- internals --------------------------------------------------------------------------------
    def _propose_on_device(self, root: int, steps: int, topk: int, budget: int) -> DraftTree:
        """The greedy tree as two graph replays and one host read (engine/drafters/eagle_graphs.py)."""
        first = self.cache.length
        features = self._pending_features(first)
        self._pending = []
        return self.graphs.draft(self.cache, self._entry_tokens(first, root), features, root, steps=steps,
                                 topk=topk, budget=budget)

    def _extend(self, root: int, picks: int = 0) -> tuple[torch.Tensor, Level]:
        """Add head entries for every committed position that lacks one; return the last entry's
        output and its log-probabilities (the root's children, ``picks`` of them picked)."""
        head, cache = self.head, self.cache
        n = len(self._tokens)
        first = cache.length
        pending = self._pending_features(first)
        features = torch.cat(pending) if len(pending) != 1 else pending[0]
        # entry p at slot p and position p, seeing every entry up to its own
        g, level = head.run(self._entry_tokens(first, root), features, None, cache, first, None, logits=1, picks=picks)
        cache.commit(n - first)
        self._pending = []
        assert level is not None
        return g[-1], level

    def _pending_features(self, first: int) -> list[torch.Tensor]:
        """The features of the positions from ``first`` on, checked to be one per position."""
        n = len(self._tokens)
        if first >= n:
            raise RuntimeError("the EAGLE drafter has no committed position to extend from")
        have = sum(f.shape[0] for f in self._pending)
        if have != n - first:
            raise RuntimeError(f"EAGLE drafter out of step: {have} features for {n - first} positions")
        return self._pending

    def _entry_tokens(self, first: int, root: int) -> list[int]:
        """Tokens of the entries from position ``first``: entry p pairs the token at p+1 with the
        feature at p (the root is the token after the last committed position)."""
        return [*self._tokens[first + 1:], root]


def load_head(found: Checked, target, tokenizer) -> DraftBundle:
    """The eagle / eagle3 registrations' load: a checked EAGLE head (engine/drafters/draft_loader.py)
    as a drafter on ``target``, with the target features its kind reads."""
    spec, weights, hot = found.parts
    head = EagleHead(spec, weights, target, hot_token_ids=hot)
    features = feature_spec(spec.kind, spec.capture_layers() if spec.kind == "eagle3" else ())
    vocab = f", {head.vocab_size} draft tokens" if head.vocab_ids is not None else ""
    return DraftBundle(spec.kind, lambda: EagleDrafter(head, spec.kind), features,
                       f"{kind_label(spec.kind)} head {found.label}{vocab}")
