"""The forward of one EAGLE head (EAGLE-1/2 or EAGLE-3) over its own small KV cache.

A head is one decoder layer that reads the target's embedding of a token and a feature stream
(target features for committed positions, its own previous output inside a draft tree) and
predicts the next token. Shapes and wiring follow the public checkpoints exactly:

* EAGLE-1/2: ``h = fc(concat(embed(x), f))``; the layer has no input norm; logits are the
  target's LM head applied to the output ``g`` (the features are already post-norm).
* EAGLE-3: ``h = fc(f_low | f_mid | f_high)`` for target features (width 3H) or the previous
  ``g`` inside the tree (width H); attention reads ``concat(norm_in(embed(x)), norm_h(h))``;
  logits are the head's own ``lm_head(norm(g))`` over the draft vocabulary, mapped back to target
  ids through ``d2t``.

The matrix products use the same skinny-product layer as the target (engine.kernels.linear),
so drafting a tree level of k nodes reads each head weight once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from engine.drafters.base import dist_to_target, head_codes, head_matrix, heads_take_fast_products, vocab_to_target
from engine.drafters.eagle_checkpoint import HeadSpec
from engine.drafters.tree_search import Level, Picks
from engine.gpu.rms_norm import rms_norm
from engine.kernels.eagle_native import Keys, NativeHead
from engine.kernels.linear import Linear
from engine.kernels.stored import StoredLinear
from engine.models.kv_cache import KVCache
from engine.models.layer import interleave_rows, make_linear
from engine.models.rope import RotaryTable, apply_rotary_interleaved, interleave_halves

if TYPE_CHECKING:
    from engine.kernels.native import NativeKernel


class EagleHead:
    """Inference-only EAGLE head bound to one target model (its embedding and, for EAGLE-1/2, its LM head)."""

    def __init__(self, spec: HeadSpec, weights: Mapping[str, torch.Tensor], target, *,
                 hot_token_ids: torch.Tensor | None = None) -> None:
        self.spec = spec
        self.target = target
        self.dtype = target.dtype
        self.device = target.device
        dt, dev = self.dtype, self.device
        nh, nkv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim

        # With a stored-weights target (CPU), the head's matrices stay compact too: 4-bit codes
        # by default (drafts are verified, so their exact values never reach the output). A level
        # of one node streams the head's matrices from memory, since the target's forward evicted
        # them, so bytes are its price: session 24 (Xeon, fast, 80 MT-bench prompts, the default
        # budget) measured 0.79 ms of drafting a step against 1.02 with 8-bit codes, tau 1.46 vs
        # 1.37 in the same kind of run (a static chain of 4 on 40 prompts: tau 1.75 vs 1.79), and
        # the target's verify forward loses less of the L3 cache to the head. SPECCHAT_HEAD_WEIGHTS
        # =q8 takes 8-bit codes (the default until then), =stored the checkpoint's own values,
        # 16-bit ones kept 16-bit (our kernels widen them exactly: the same drafts as fp32).
        stored = target.weights == "stored"

        def w(key: str) -> torch.Tensor:
            return weights[key].to(device=dev, dtype=dt)

        codes = head_codes(stored)
        q8 = codes in ("q8", "q4")

        def matrix(key: str, heads: int = 0) -> Any:
            t = head_matrix(weights[key], codes, stored, dt, dev)
            return interleave_rows(t, heads, hd) if heads else t

        def maybe(key: str) -> torch.Tensor | None:
            return w(key) if key in weights else None

        p = "layers.0." if spec.kind == "eagle" else "midlayer."
        att = p + "self_attn."
        qkv = [matrix(att + "q_proj.weight", nh), matrix(att + "k_proj.weight", nkv), matrix(att + "v_proj.weight")]
        biases = [maybe(att + f"{x}_proj.bias") for x in "qkv"]
        qkv_b = None
        if any(b is not None for b in biases):
            sizes = (nh * hd, nkv * hd, nkv * hd)
            parts = [b if b is not None else torch.zeros(n, dtype=dt, device=dev) for b, n in zip(biases, sizes,
                                                                                                    strict=True)]
            qkv_b = torch.cat([interleave_halves(parts[0], nh, hd), interleave_halves(parts[1], nkv, hd), parts[2]])
        self.qkv = make_linear(qkv, qkv_b)
        self.o = make_linear([matrix(att + "o_proj.weight")], None)
        self.gate_up = make_linear([matrix(p + "mlp.gate_proj.weight"), matrix(p + "mlp.up_proj.weight")], None)
        self.down = make_linear([matrix(p + "mlp.down_proj.weight")], None)
        self.ln_post = w(p + "post_attention_layernorm.weight")
        self.fc = make_linear([matrix("fc.weight")], maybe("fc.bias"))
        self.fc_norms = [w(f"fc_norm.{i}.weight") for i in range(len(spec.aux_layer_ids))] if spec.fc_norm else []
        self.ln_in = maybe(p + "input_layernorm.weight")
        self.ln_hidden = maybe(p + "hidden_norm.weight")
        self.norm = maybe("norm.weight")
        # the head's vocabulary: draft id -> target id
        if spec.kind == "eagle3":
            self.lm_head: Linear | StoredLinear | None = make_linear([matrix("lm_head.weight")], None)
            d2t = weights.get("d2t")
            offsets = d2t.to(torch.int64) if d2t is not None else torch.zeros(spec.draft_vocab_size, dtype=torch.int64)
            self.vocab_ids = (torch.arange(spec.draft_vocab_size) + offsets).to(dev)
        elif hot_token_ids is not None:  # FR-Spec: the target's LM head restricted to frequent tokens
            self.lm_head = Linear(_lm_head_rows(target, hot_token_ids.to(dev)))
            self.vocab_ids = hot_token_ids.to(dev)
        else:
            self.lm_head = None  # the target's own LM head
            self.vocab_ids = None
        self.rotary = RotaryTable.for_shape(spec, dev)
        self.scale = hd**-0.5
        # a level in one native call where the target runs our CPU kernels (SPECCHAT_NATIVE_HEAD=0: per op)
        ops = target.ops
        self.native = self._bind_native(ops) if os.environ.get("SPECCHAT_NATIVE_HEAD", "1") != "0" else None
        self.kernel = ops if self.native is not None else None  # also picks coupled drafts (tree_search.py)
        if self.native is not None and q8:
            # the fast precision's integer products on its 8-bit codes wherever the CPU has them
            self.native.fast = heads_take_fast_products(ops)

    def _bind_native(self, ops: NativeKernel | None) -> NativeHead | None:
        """The head on our native kernel (eagle_native.c), where the target runs them and the head suits them."""
        if ops is None or self.dtype != torch.float32 or self.device.type != "cpu" or self.fc_norms:
            return None
        lm_head = self.lm_head if self.lm_head is not None else self.target.lm_head
        return NativeHead.bind(ops, self.spec, (self.fc, self.qkv, self.o, self.gate_up, self.down, lm_head),
                               (self.ln_in, self.ln_hidden, self.ln_post, self.norm),
                               eagle3=self.spec.kind == "eagle3")

    def run(self, tokens: torch.Tensor | list[int], stream: torch.Tensor, positions: torch.Tensor | list[int] | None,
            cache: KVCache, start: int, keys: Keys | None, logits: int = 0, picks: int = 0
            ) -> tuple[torch.Tensor, Level | None]:
        """Entries ``tokens`` at slots start.. of ``cache``, each attending to the slots ``keys``
        lists; returns their outputs g [T, H] and the log-probabilities of the last ``logits``
        of them (None for 0), with each row's ``picks`` best children as target ids where the native
        kernel runs (the greedy search reads those; tree_search.py says why). One native call where
        there is one, the per-op forward otherwise. ``positions`` None: each entry's slot; ``keys``
        None: each entry sees every slot up to its own (both: a catch-up of committed positions).

        ``tokens`` and ``positions`` may be plain lists (the drafters build them so): the native call
        reads them as C arrays, with no torch operation (each costs ~5-20 us with the caches cold
        after the target's forward, and a level had half a dozen). On a GPU, where the per-op path
        runs, they go over with ``non_blocking`` copies: there a level's kernels are tiny, and every
        host read of a device value or blocking copy drains the queue first, so the level's one wait
        is the tree search reading its candidates (tests/gpu/test_fake_cuda.py counts them);
        ``positions`` may stay on the host, where the rotary table's size is read from them."""
        T = len(tokens)
        if cache.capacity < start + T:
            cache.grow(start + T + 256)
        if self.native is None:
            return self._run_per_op(tokens, stream, positions, cache, start, keys, logits)
        # positions never pass their entry's slot (a node sits after its ancestors), so the table
        # is sized without reading them; the kernel checks each against it
        self.rotary.ensure(start + T)
        emb = self._embed(tokens)
        g, logp, top = self.native.forward(emb, stream if stream.dtype == torch.float32 and stream.is_contiguous()
                                           else stream.float().contiguous(), self.rotary.table, positions,
                                           cache.k[0], cache.v[0], start, keys, logits, picks, self.vocab_ids)
        return g, (None if logp is None else Level(logp, None if top is None else Picks(*top)))

    def _embed(self, tokens: torch.Tensor | list[int]) -> torch.Tensor:
        """fp32 [T, H] contiguous embeddings of host ``tokens`` (the native head's input)."""
        embed_rows = getattr(self.target, "embed_rows", None)
        if embed_rows is not None:
            return embed_rows(tokens)
        ids = tokens if isinstance(tokens, torch.Tensor) else torch.tensor(tokens, dtype=torch.int64)
        return self.target.embed_tokens(ids).float().contiguous()

    @torch.inference_mode()
    def _run_per_op(self, tokens: torch.Tensor | list[int], stream: torch.Tensor,
                    positions: torch.Tensor | list[int] | None, cache: KVCache, start: int, keys: Keys | None,
                    logits: int) -> tuple[torch.Tensor, Level | None]:
        T = len(tokens)
        if not isinstance(tokens, torch.Tensor):
            tokens = torch.tensor(tokens, dtype=torch.int64).to(self.device, non_blocking=True)
        if positions is None:
            positions = torch.arange(start, start + T)
        elif not isinstance(positions, torch.Tensor):
            positions = torch.tensor(positions, dtype=torch.int64)
        keys = Keys.causal(start, T) if keys is None else keys
        g = self.forward(tokens, stream, positions, cache, start, keys.mask(start + T))
        return g, (Level(self.log_probs(g[T - logits:])) if logits else None)

    @property
    def vocab_size(self) -> int:
        return self.spec.draft_vocab_size if self.vocab_ids is None else int(self.vocab_ids.numel())

    def new_cache(self, capacity: int) -> KVCache:
        s = self.spec
        return KVCache(1, s.num_kv_heads, s.head_dim, capacity, dtype=self.dtype, device=self.device)

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.spec.rms_norm_eps)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, stream: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                start: int, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Run T entries and return their outputs ``g`` [T, H] (pre-norm; the next level's stream).

        tokens: [T] target ids. stream: [T, F] target features (F = 3H for EAGLE-3, H for EAGLE-1/2)
        or earlier outputs g (EAGLE-3, width H). K/V are written to cache slots [start, start+T).
        key_mask: [T, start+T] bool, which cached entries each row sees; None = every entry before
        ``start`` plus a causal block over the new ones.
        """
        T = tokens.shape[0]
        h, a = self._layer_input(tokens, stream)
        self.rotary.ensure(int(positions.max()) + 1)
        q, k, v = self._qkv(a, self.rotary.lookup(positions.to(self.device, non_blocking=True)))
        if cache.capacity < start + T:
            cache.grow(start + T + 256)
        cache.k[0, :, start: start + T] = k.transpose(0, 1)
        cache.v[0, :, start: start + T] = v.transpose(0, 1)
        if key_mask is None:
            key_mask = torch.ones(T, start + T, dtype=torch.bool)
            key_mask[:, start:] = torch.ones(T, T, dtype=torch.bool).tril_()
        # built where the mask is: a host mask (Keys) goes over in one copy, a device one (the device
        # tree search's ancestors) is never read back
        return self._attend_and_finish(h, q, cache.k[:, :, : start + T], cache.v[:, :, : start + T],
                                       key_mask.to(self.device, non_blocking=True))

    @torch.inference_mode()
    def static_forward(self, tokens: torch.Tensor, stream: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                       slots: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` with no shape or host value depending on the step (a CUDA graph's body):
        ``positions`` and ``slots`` [T] are device tensors, K/V go in with ``index_copy_`` at
        ``slots``, and attention reads the whole cache through ``allowed`` [T, capacity] (bool,
        built on the device). The rotary table must already cover the positions."""
        h, a = self._layer_input(tokens, stream)
        q, k, v = self._qkv(a, self.rotary.lookup(positions))
        cache.k[0].index_copy_(1, slots, k.transpose(0, 1))
        cache.v[0].index_copy_(1, slots, v.transpose(0, 1))
        return self._attend_and_finish(h, q, cache.k, cache.v, allowed)

    def _layer_input(self, tokens: torch.Tensor, stream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, the attention's input): the residual stream entering the layer and what it attends with."""
        s = self.spec
        e = self.target.embed_tokens(tokens).to(self.dtype)
        stream = stream.to(self.dtype)
        if s.kind != "eagle3":
            h = self.fc(torch.cat([e, stream], dim=-1))
            return h, h
        if stream.shape[-1] != s.hidden_size:
            if self.fc_norms:
                chunks = stream.split(s.target_hidden_size, dim=-1)
                stream = torch.cat([self._rms(c, wt) for c, wt in zip(chunks, self.fc_norms, strict=True)], -1)
            stream = self.fc(stream)
        return stream, torch.cat([self._rms(e, self.ln_in), self._rms(stream, self.ln_hidden)], dim=-1)

    def _qkv(self, a: torch.Tensor, rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated q [T, nh, hd], rotated k and v [T, nkv, hd]."""
        s = self.spec
        T, nh, nkv, hd = a.shape[0], s.num_heads, s.num_kv_heads, s.head_dim
        qkv = self.qkv(a)
        k_end = (nh + nkv) * hd
        qk = apply_rotary_interleaved(qkv[:, :k_end].view(T, nh + nkv, hd), rot)
        return qk[:, :nh], qk[:, nh:], qkv[:, k_end:].view(T, nkv, hd)

    def _attend_and_finish(self, h: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                           key_mask: torch.Tensor) -> torch.Tensor:
        """Attention of q over ``keys``/``values`` [1, nkv, S, hd] where ``key_mask`` [T, S] allows,
        then the output projection and the MLP: the layer's output g."""
        s = self.spec
        T, nh, nkv = q.shape[0], s.num_heads, s.num_kv_heads
        bias = torch.zeros(key_mask.shape, dtype=self.dtype, device=key_mask.device).masked_fill_(~key_mask,
                                                                                                   float("-inf"))
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1).unsqueeze(0), keys, values, attn_mask=bias, scale=self.scale, enable_gqa=nkv != nh,
        )[0].transpose(0, 1).reshape(T, nh * s.head_dim)
        x = h + self.o(out)
        gate, up = self.gate_up(self._rms(x, self.ln_post)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)

    @torch.inference_mode()
    def log_probs(self, g: torch.Tensor) -> torch.Tensor:
        """[T, vocab] float32 log-probabilities over the head's vocabulary (see :meth:`to_target`)."""
        if self.spec.kind == "eagle3":
            logits = self.lm_head(self._rms(g, self.norm)).float()
        elif self.lm_head is not None:
            logits = self.lm_head(g).float()
        else:
            logits = self.target.logits_from_hidden(g)
        return torch.log_softmax(logits, dim=-1)

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Head vocabulary indices -> target token ids."""
        return vocab_to_target(self.vocab_ids, ids)

    def to_target_dist(self, q: torch.Tensor) -> torch.Tensor:
        """A distribution over the head vocabulary as one over the target's (zero elsewhere)."""
        return dist_to_target(self.vocab_ids, self.target.config.vocab_size, q)


def _lm_head_rows(target, ids: torch.Tensor) -> torch.Tensor:
    """The target LM head's rows for ``ids`` as a dense [len(ids), H] weight."""
    head = target.lm_head
    dense = getattr(head, "dense_weight", None)
    if dense is None:  # a head stored in another form: recover its rows through the head itself
        eye = torch.eye(target.config.hidden_size, dtype=target.dtype, device=target.device)
        dense = head(eye).T
    return dense[ids].contiguous()
