"""A small language model with the target's tokenizer as the drafter (SGLang's STANDALONE).

Its KV cache mirrors the target's: committed tokens only, kept across steps and turns, cut back
to the common prefix when a conversation diverges. Each step runs the tokens committed since the
last step plus the root in one forward (the root's entry stays as scratch), then grows an
EAGLE-2-style tree level by level (engine.drafters.tree_search): one forward per level over the
frontier, each node attending to the committed prefix, the root and its own ancestors only.

After verification the accepted path is compacted like the target's cache: the scratch entries
of the root and of every accepted node that was expanded already hold exactly the K/V a plain
forward would compute (same token, position and ancestors), so they are moved into place and
only the rest (at most the last accepted node, and the new root) is run in the next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from engine.config import SpecConfig
from engine.drafters.base import head_codes, heads_take_fast_products
from engine.drafters.draft_loader import (
    Checked,
    DraftBundle,
    DraftLoadError,
    check_same_tokenizer,
    draft_tokenizer,
    standalone_config,
)
from engine.drafters.tree_search import Candidates, DraftRandom, StopRule, check_topk, coupled_scores, grow_tree
from engine.gpu.graphs import DraftMemory
from engine.methods import chain_size
from engine.models.kv_cache import KVCache
from engine.prefix import common_prefix
from engine.sampling import GumbelNoise
from engine.tree import DraftTree


class StandaloneDrafter:
    name = "standalone"
    needs_features = False
    pays_per_level = True

    def __init__(self, model, vocab_size: int) -> None:
        """``vocab_size``: the target's; draft logits past it (padding rows) are never proposed."""
        self.model = model
        self.vocab_size = min(vocab_size, model.config.vocab_size)
        self.target_vocab = vocab_size
        # the cache, with the draft model's graphs that read it, taken over by the next drafter of
        # this model (engine/gpu/graphs.py, DraftMemory): a new cache would capture them again
        self.memory: DraftMemory[Any] = DraftMemory(model, model.new_cache(512), model.static_graphs)
        self._tokens: list[int] = []
        self._random = DraftRandom()
        # the last proposal: (tree, scratch slot of each tree row that has an entry)
        self._last: tuple[DraftTree, dict[int, int]] | None = None

    @property
    def cache(self) -> KVCache:
        """The draft model's KV cache (the memory's, where its graphs read it)."""
        return self.memory.cache

    def check(self, config: SpecConfig) -> None:
        check_topk(config, self.vocab_size, "draft model")

    def reset(self, history: Sequence[int], features: torch.Tensor | None = None) -> None:
        self._last = None
        history = list(history)
        self.cache.truncate(min(self.cache.length, common_prefix(self._tokens, history)))
        self._tokens = history

    def observe(self, committed: Sequence[int], features: torch.Tensor | None = None) -> None:
        committed = list(committed)
        if self._last is not None and self.cache.length == len(self._tokens):
            self._compact(committed, *self._last)
        self._last = None
        self._tokens.extend(committed)

    def _compact(self, committed: list[int], tree: DraftTree, slot_of_row: dict[int, int]) -> None:
        """Keep the scratch entries of the committed path's leading rows that have one."""
        if not committed or tree.tokens[0] != committed[0]:
            return
        children = tree.children()
        rows = [0]
        for token in committed[1:]:
            nxt = next((c for c in children[rows[-1]] if tree.tokens[c] == token), None)
            if nxt is None:
                break
            rows.append(nxt)
        slots = []
        for r in rows:
            if r not in slot_of_row:
                break
            slots.append(slot_of_row[r] - self.cache.length)
        if slots:
            self.cache.commit(slots)

    def truncate(self, length: int) -> None:
        self._last = None
        self._tokens = self._tokens[:length]
        self.cache.truncate(min(self.cache.length, length))

    def _tree_level(self, frontier: list[int], cands: Candidates, tokens: torch.Tensor, n: int, start: int,
                    slots: dict[int, int]):
        """A tree level: each frontier node sees the committed tokens, the root and its own ancestors'
        scratch entries, never another branch's (a prefix mask, which keeps the forward on the
        per-op path: decoder.c knows no prefix masks).

        A chain's level needs none of this, and ``propose`` runs it as a plain decoding step: its one
        node's ancestors are every scratch entry before it, in order, at the positions their slots
        say, so the forward of the draft model over its cache is the one plain decoding of that
        prefix runs (the native decoder in one call, a CUDA graph on a GPU), and the entries it
        leaves are exactly those plain decoding would (what the compaction after verification
        keeps). Why: the per-op path runs each of the draft model's ~10 ops a layer from Python, with
        torch's masked attention, where a plain step is one native call; a chain drafts a level a
        forward, so that overhead was paid on every drafted token."""
        model = self.model
        seen = torch.zeros(len(frontier), start, dtype=torch.bool)
        seen[:, : n + 1] = True  # committed tokens and the root
        for row, i in enumerate(frontier):
            for a in cands.ancestors(i)[:-1]:
                seen[row, slots[a]] = True
        positions = torch.tensor([n + cands.depth[i] for i in frontier]).to(model.device, non_blocking=True)
        return model.forward(tokens, self.cache, positions=positions, prefix_mask=seen,
                             tree_mask=torch.eye(len(frontier), dtype=torch.bool))

    def _full_vocab(self, q: torch.Tensor) -> torch.Tensor:
        """Draft distributions cover the target's first ``vocab_size`` ids; pad to the target's vocabulary."""
        return torch.nn.functional.pad(q, (0, self.target_vocab - q.shape[-1]))

    def _log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(logits[..., : self.vocab_size].float(), dim=-1)

    def propose(self, history: Sequence[int], root: int, config: SpecConfig, *,
                noise: GumbelNoise | None = None, stop: StopRule | None = None) -> DraftTree:
        model, cache = self.model, self.cache
        n = len(self._tokens)
        steps, topk = config.num_steps, config.tree_width
        budget = min(config.num_draft_tokens, chain_size(steps)) if topk == 1 else config.num_draft_tokens
        need = n + 1 + steps * topk + 8
        if cache.capacity < need:
            cache.grow(need + 256)
        first = cache.length
        # host data goes over without waiting for the device's queue (EagleHead.run says why)
        new = torch.tensor([*self._tokens[first:], root]).to(model.device, non_blocking=True)
        out = model.forward(new, cache, logits="last")
        cache.commit(n - first)  # the root's entry (slot n) stays scratch: the target has not kept it yet
        root_logp = self._log_probs(out.logits[-1])
        slots: dict[int, int] = {}

        def expand(frontier: list[int], cands: Candidates) -> torch.Tensor:
            start = n + 1 + len(slots)
            earlier = len(slots)
            for j, i in enumerate(frontier):
                slots[i] = start + j
            tokens = torch.tensor([cands.tokens[i] for i in frontier]).to(model.device, non_blocking=True)
            cache.length = start  # write this level after the scratch entries of earlier levels
            try:
                if len(frontier) == 1 and len(cands.ancestors(frontier[0])) - 1 == earlier:
                    res = model.forward(tokens, cache)  # a chain: a plain decoding step (_tree_level says why)
                else:
                    res = self._tree_level(frontier, cands, tokens, n, start, slots)
            finally:
                cache.length = n
            return self._log_probs(res.logits)

        tree, _, chosen = grow_tree(root, root_logp, expand, lambda ids: ids, num_steps=steps, topk=topk,
                                    num_draft_tokens=budget,
                                    sampling=self._random.sampling(config, self._full_vocab),
                                    coupled=coupled_scores(config, noise, n, None), stop=stop)
        slot_of_row = {0: n}
        slot_of_row.update({row: slots[c] for row, c in enumerate(chosen, start=1) if c in slots})
        self._last = (tree, slot_of_row)
        return tree


def load_model_draft(found: Checked, target, tokenizer) -> DraftBundle:
    """The standalone registration's load: a checked small model (engine/drafters/draft_loader.py)
    with ``tokenizer``'s vocabulary, built on ``target``'s device and dtype."""
    from engine.models.llama_config import UnsupportedModelError

    draft_config, model_class = standalone_config(found.config, found.label)
    check_same_tokenizer(draft_tokenizer(found.path, found.label), tokenizer, found.label)
    if head_codes(getattr(target, "weights", "fp32") == "stored") == "q4":
        narrow_codes(found.state)
    try:
        model = model_class(draft_config, found.state, dtype=target.dtype, device=target.device, consume=True,
                            weights=getattr(target, "weights", "fp32"))
    except UnsupportedModelError as e:
        raise DraftLoadError(f"draft {found.label}: {e}") from None
    if model.fast_available and heads_take_fast_products(model.ops):
        model.precision = "fast"  # drafts are verified: their arithmetic never reaches the answer
    vocab = target.config.vocab_size
    return DraftBundle("standalone", lambda: StandaloneDrafter(model, vocab), None,
                       f"standalone draft {found.label} ({draft_config.num_layers} layers)")


def narrow_codes(state: dict) -> int:
    """A draft model's matrices (its file's 8- and 6-bit blocks, float ones, or dense weights)
    requantized to 4-bit codes in place (group 32,
    Q4_1's recipe), as a draft head's are (engine/drafters/base.py: ``SPECCHAT_HEAD_WEIGHTS``, q4 by
    default; "q8" or "stored" keep the file's blocks). Returns the matrices narrowed.

    Why: a standalone drafter streams all its weights once a level, so its bytes are its price,
    and its drafts are verified, so their rounding never reaches the answer. The Qwen2.5-Coder 0.5B
    (Q5_0/Q8_0 blocks, read as 8-bit codes, and its 151,936-row tied embedding in Q8_0) read 487 MB
    a level, half of what its 1.5B target reads in a whole step; at 4 bits it reads about 307 MB.
    One matrix at a time, so the fp32 copy a requantization needs is never the whole model's."""
    from engine.kernels.weights import QuantRows

    narrowed = 0
    for name, weight in state.items():
        if isinstance(weight, QuantRows) and weight.kind != "q4" and weight.shape[1] % 32 == 0:
            state[name] = QuantRows.quantize_q4(weight.dequantize())
        elif isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.is_floating_point() \
                and weight.shape[1] % 32 == 0:
            state[name] = QuantRows.quantize_q4(weight)
        else:
            continue
        narrowed += 1
    return narrowed
