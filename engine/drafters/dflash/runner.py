"""A DFlash drafter bound to one target for inference: our products, and a KV cache of the context.

The layer is the module's own (engine/drafters/dflash/model.py, ``run_layer``); what differs is how
its products run. q | k | v and gate | up are one product each, on the same kernels as the target
(engine/kernels), and on a target with stored weights the matrices are kept as 4-bit codes by
default, like an EAGLE head's (``SPECCHAT_HEAD_WEIGHTS``; engine/drafters/base.py): drafts are
verified, so their rounding never reaches the answer, and on a CPU bytes are a drafter's price.

The draft KV cache holds, per draft layer, the keys and values of every committed context row (row
p: the target features of token p, at RoPE position p). A forward writes the newly committed rows
and the block's own after them, attends over both, then keeps only the context rows: each step
pays for the rows committed since the last one, never for the whole context again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from engine.drafters.base import dist_to_target, head_codes, head_matrix, heads_take_fast_products, vocab_to_target
from engine.drafters.dflash.model import DFlashSpec, LayerOps, run_layer
from engine.gpu.rms_norm import rms_norm
from engine.kernels.stored import StoredLinear
from engine.models.kv_cache import KVCache
from engine.models.layer import make_linear
from engine.models.rope import RotaryTable


class DFlashRunner:
    """The drafter's inference forward on ``target`` (a LlamaModel: its embedding and LM head)."""

    def __init__(self, spec: DFlashSpec, weights: Mapping[str, torch.Tensor], target: Any) -> None:
        self.spec = spec
        self.target = target
        self.dtype, self.device = target.dtype, target.device
        stored = target.weights == "stored"
        codes = head_codes(stored)

        def matrix(key: str) -> Any:
            return head_matrix(weights[key], codes, stored, self.dtype, self.device)

        def vector(key: str) -> torch.Tensor:
            return weights[key].to(device=self.device, dtype=self.dtype)

        self.layers = [self._layer(f"layers.{i}.", matrix, vector) for i in range(spec.num_layers)]
        self.fc = make_linear([matrix("fc.weight")], None)
        self.hidden_norm, self.norm = vector("hidden_norm.weight"), vector("norm.weight")
        self.lm_head = make_linear([matrix("lm_head.weight")], None) if spec.draft_vocab_size else None
        d2t = weights.get("d2t")
        # the drafter's vocabulary as target ids (None: the target's own)
        self.vocab_ids = (torch.arange(spec.draft_vocab_size) + d2t.to(torch.int64)).to(self.device) \
            if d2t is not None else None
        self.rotary = RotaryTable.for_shape(spec, self.device)
        fast = heads_take_fast_products(getattr(target, "ops", None))
        for lin in self._linears():
            if isinstance(lin, StoredLinear):
                lin.fast = fast  # the fast precision's integer products on the 8-bit codes, where the CPU has them
        # the block after its anchor is the mask token's embedding, the same every step
        self.mask_rows = self._embed([spec.mask_token_id] * spec.drafts)
        # our native kernel where the log-probabilities are host tensors (coupled drafting picks with it)
        self.kernel = getattr(target, "ops", None) if self.device.type == "cpu" else None
        self.forwards = 0  # block forwards run (one per drafted step)

    def _layer(self, p: str, m: Callable[[str], Any], vec: Callable[[str], torch.Tensor]) -> LayerOps:
        """Layer ``p``'s products fused (q|k|v, gate|up) and its norm weights."""
        a = p + "self_attn."
        biases = [a + f"{x}_proj.bias" for x in "qkv"]
        qkv_bias = torch.cat([vec(b) for b in biases]) if self.spec.attention_bias else None
        o_bias = vec(a + "o_proj.bias") if self.spec.attention_bias else None
        return LayerOps(
            qkv=make_linear([m(a + "q_proj.weight"), m(a + "k_proj.weight"), m(a + "v_proj.weight")], qkv_bias),
            o=make_linear([m(a + "o_proj.weight")], o_bias),
            gate_up=make_linear([m(p + "mlp.gate_proj.weight"), m(p + "mlp.up_proj.weight")], None),
            down=make_linear([m(p + "mlp.down_proj.weight")], None),
            ln_in=vec(p + "input_layernorm.weight"), ln_post=vec(p + "post_attention_layernorm.weight"),
            q_norm=vec(a + "q_norm.weight"), k_norm=vec(a + "k_norm.weight"))

    def _linears(self) -> list[Callable[[torch.Tensor], torch.Tensor]]:
        out: list[Any] = [self.fc, *(op for lay in self.layers for op in (lay.qkv, lay.o, lay.gate_up, lay.down))]
        return out + ([self.lm_head] if self.lm_head is not None else [])

    def _embed(self, tokens: list[int]) -> torch.Tensor:
        """The target's embedding rows of ``tokens`` [T, H] in the drafter's dtype."""
        embed_rows = getattr(self.target, "embed_rows", None)
        if embed_rows is not None and self.device.type == "cpu":
            return embed_rows(tokens).to(self.dtype)
        ids = torch.tensor(tokens, dtype=torch.int64).to(self.device)
        return self.target.embed_tokens(ids).to(self.dtype)

    def new_cache(self, capacity: int) -> KVCache:
        s = self.spec
        return KVCache(s.num_layers, s.num_kv_heads, s.head_dim, capacity, dtype=self.dtype, device=self.device)

    @torch.inference_mode()
    def forward(self, features: torch.Tensor | None, cache: KVCache, anchor: int) -> torch.Tensor:
        """One block: the context rows of ``features`` [T, feature_width] (the tokens committed since
        the cache's last row, at positions cache.length..) join the cache, and the block [anchor,
        mask, ...] right after them is run over the whole context. Returns the block's hidden states
        [block_size, H] after the final norm; the cache then holds the context rows only."""
        s = self.spec
        first = cache.length
        new = 0 if features is None else features.shape[0]
        end = first + new + s.block_size
        if cache.capacity < end:
            cache.grow(end + 256)
        ctx = rms_norm(self.fc(features.to(self.dtype)), self.hidden_norm, s.rms_norm_eps) if new else \
            self.mask_rows[:0]
        h = torch.cat([self._embed([anchor]), self.mask_rows])
        self.rotary.ensure(end)
        rot = self.rotary.table[first:end].unsqueeze(1)
        for i, ops in enumerate(self.layers):
            h = run_layer(s, ops, h, ctx, rot, self._keep(cache, i, first, end), None)
        cache.commit(new)  # the context rows stay; the block's scratch rows are overwritten next step
        self.forwards += 1
        return rms_norm(h, self.norm, s.rms_norm_eps)

    @staticmethod
    def _keep(cache: KVCache, layer: int, first: int, end: int
              ) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
        """Write a layer's new rows (context then block) at slots first..end and hand back every
        key and value up to ``end``: views of the cache, never a copy of the context."""
        def keep(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            cache.k[layer, :, first:end] = k.transpose(0, 1)
            cache.v[layer, :, first:end] = v.transpose(0, 1)
            return cache.k[layer: layer + 1, :, :end], cache.v[layer: layer + 1, :, :end]
        return keep

    @torch.inference_mode()
    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, vocab] float32 log-probabilities over the drafter's vocabulary (:meth:`to_target`)."""
        logits = self.lm_head(hidden).float() if self.lm_head is not None else self.target.logits_from_hidden(hidden)
        return torch.log_softmax(logits, dim=-1)

    @property
    def vocab_size(self) -> int:
        return self.spec.draft_vocab_size or self.spec.vocab_size

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Drafter vocabulary indices -> target token ids."""
        return vocab_to_target(self.vocab_ids, ids)

    def to_target_dist(self, q: torch.Tensor) -> torch.Tensor:
        """A distribution over the drafter vocabulary as one over the target's (zero elsewhere)."""
        return dist_to_target(self.vocab_ids, self.spec.vocab_size, q)
