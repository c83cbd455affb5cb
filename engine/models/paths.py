"""The ways a :class:`~engine.models.llama.LlamaModel` runs its decoder layers, one class each.

The model picks one at construction (:func:`pick_path`) and its forward calls ``run`` without
asking which it has:

- :class:`NativeDecoderPath`: every layer in one native call (decoder.c), captured layer inputs included;
  CPU, fp32 activations, every shape suiting our kernels. Forwards with a prefix mask (a draft
  model growing a tree level by level) take the per-op path below.
- :class:`NativeOpsPath`: our CPU kernels op by op (norms, activation, attention, products);
  models the one-call decoder cannot run (q/k norms) or ``SPECCHAT_NATIVE_DECODER=0``.
- :class:`TorchPath`: torch ops throughout; the reference, on any device and dtype. On CUDA the
  model puts its static-shape forward (engine/gpu/static.py) in front of it.

All three read and write the same things (the cache's scratch slots, the residual stream, the
captured layer inputs), so the two native paths give bit-identical results
(tests/test_decoder_native.py) and any path can stand in for another.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.gpu.rms_norm import rms_norm
from engine.kernels import native
from engine.kernels.decoder import NativeDecoder
from engine.kernels.linear import Linear
from engine.kernels.native import NativeKernel
from engine.kernels.stored import StoredLinear
from engine.models.kv_cache import KVCache
from engine.models.layer import LayerWeights
from engine.models.llama_config import LlamaConfig

Attend = Callable[[torch.Tensor, int, KVCache], torch.Tensor]  # (q [T, nh, hd], layer, cache) -> [T, nh*hd]


@dataclass
class Span:
    """The T new tokens of one forward: where they sit and what they may see."""

    length: int  # entries already committed in the cache (the new ones go to length..length+T-1)
    positions: torch.Tensor  # [T] int64 on the model's device
    rot: torch.Tensor  # [T, 1, head_dim/2] rotary factors for those positions
    tree_mask: torch.Tensor | None  # [T, T] bool among the new tokens (None: causal)
    prefix_mask: torch.Tensor | None  # [T, length] bool over the cached entries (None: all)
    rot_local: torch.Tensor | None = None  # the sliding-window layers' own rotations (Gemma 3), if any

    @property
    def T(self) -> int:
        """How many new tokens (the T of every shape comment in the forward)."""
        return self.positions.shape[0]


class TorchPath:
    """Decoder layers in torch ops; also the skeleton the per-op native path fills in."""

    def __init__(self, config: LlamaConfig, layers: Sequence[LayerWeights], dtype: torch.dtype,
                 device: torch.device) -> None:
        self.config = config
        self.layers = layers
        self.dtype = dtype
        self.device = device
        self.scale = config.head_dim**-0.5

    def run(self, x: torch.Tensor, cache: KVCache, span: Span, capture: Sequence[int]
            ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """x [T, H] (the embedded tokens) through every layer; returns the residual stream after the
        last one and the residual entering each layer in ``capture`` (index num_layers: the output)."""
        attend = self._attention(span)
        c = self.config
        nh, L, T = c.num_heads, span.length, span.T
        aux: list[torch.Tensor] = []
        for li, layer in enumerate(self.layers):
            if li in capture:
                aux.append(self._snapshot(x))
            qk, v = layer.project(self.rms_norm(x, layer.ln_attn), self._rot(span, li), c)
            cache.k[li, :, L : L + T] = qk[:, nh:].transpose(0, 1)
            cache.v[li, :, L : L + T] = v.transpose(0, 1)
            x = self._finish(layer, x, attend(qk[:, :nh], li, cache))
        if len(self.layers) in capture:
            aux.append(x)
        return x, aux

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """Per row; on CUDA bf16 the batch-invariant kernel (engine/gpu/rms_norm.py)."""
        return rms_norm(x, weight, self.config.rms_norm_eps)

    def set_fast(self, on: bool) -> None:
        """The fast precision reaches this path through its StoredLinear layers only."""

    def _snapshot(self, x: torch.Tensor) -> torch.Tensor:
        return x  # the stream is replaced, never written in place, on this path

    def _rot(self, span: Span, li: int) -> torch.Tensor:
        """Layer li's rotations: one table for every layer here (Gemma 3 has two)."""
        return span.rot

    def _finish(self, layer: LayerWeights, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """The rest of a layer after attention: the output projection, then the MLP, each added."""
        x = x + layer.o(att)
        return x + layer.mlp(self.rms_norm(x, layer.ln_mlp))

    def _attention(self, span: Span) -> Attend:
        """Every layer's attention: the model's window (if any) on every layer here."""
        return self._attend(span, self.config.sliding_window)

    def _attend(self, span: Span, window: int | None) -> Attend:
        """torch's attention with one mask built for the whole forward."""
        mask, causal = attention_mask(span, window, self.dtype, self.device)
        end = span.length + span.T

        def attend(q: torch.Tensor, li: int, cache: KVCache) -> torch.Tensor:
            # an fp16 cache (the fast precision's) widened exactly to the queries' type
            k, v = cache.k[li, :, :end].to(q.dtype), cache.v[li, :, :end].to(q.dtype)
            return sdpa(q, k, v, mask, causal, self.scale)

        return attend


class NativeOpsPath(TorchPath):
    """Decoder layers op by op on our CPU kernels: the residual adds happen in place."""

    def __init__(self, config: LlamaConfig, layers: Sequence[LayerWeights], ops: NativeKernel) -> None:
        super().__init__(config, layers, torch.float32, torch.device("cpu"))
        self.ops = ops

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, weight, self.config.rms_norm_eps)

    def _snapshot(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()  # the adds below write into x

    def _finish(self, layer: LayerWeights, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        layer.o.add_into(x, att)  # x += o(att), in place (x is this forward's own tensor)
        layer.down.add_into(x, self.ops.silu_mul(layer.gate_up(self.rms_norm(x, layer.ln_mlp))))
        return x

    def _attend(self, span: Span, window: int | None) -> Attend:
        """Our tree attention; torch's masked attention where a prefix mask hides cached entries."""
        if span.prefix_mask is not None:
            return super()._attend(span, window)
        tree = span.tree_mask.to("cpu", torch.bool).contiguous() if span.tree_mask is not None else None
        positions = span.positions.to("cpu", torch.int64).contiguous()

        def attend(q: torch.Tensor, li: int, cache: KVCache) -> torch.Tensor:
            return self.ops.attention(q, cache.k[li], cache.v[li], span.length, tree, window or 0, positions,
                                      self.scale)

        return attend


class NativeDecoderPath(NativeOpsPath):
    """Every layer in one native call (decoder.c): the same kernels in the same order."""

    def __init__(self, config: LlamaConfig, layers: Sequence[LayerWeights], ops: NativeKernel,
                 decoder: NativeDecoder) -> None:
        super().__init__(config, layers, ops)
        self.decoder = decoder

    def set_fast(self, on: bool) -> None:
        self.decoder.fast = on

    def run(self, x: torch.Tensor, cache: KVCache, span: Span, capture: Sequence[int]
            ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if span.prefix_mask is not None:  # decoder.c knows no prefix masks
            return super().run(x, cache, span, capture)
        tree = span.tree_mask.to("cpu", torch.bool).contiguous() if span.tree_mask is not None else None
        positions = span.positions.to("cpu", torch.int64).contiguous()
        rot = span.rot.reshape(span.T, -1).contiguous()
        return x, self.decoder.run(x, cache, rot, tree, positions, sorted(set(capture)))  # in layer order, as above

    def run_rows(self, x: torch.Tensor, cache: KVCache, rot: torch.Tensor, positions: torch.Tensor,
                 seg: torch.Tensor, slots: torch.Tensor, capture: Sequence[int]
                 ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Tokens of independent sequences sharing ``cache`` (see LlamaModel.forward_rows)."""
        rot = rot.reshape(x.shape[0], -1).contiguous()
        return x, self.decoder.run_rows(x, cache.k, cache.v, rot, positions, seg, slots, sorted(set(capture)))


def pick_path(config: LlamaConfig, layers: Sequence[LayerWeights], ops: NativeKernel | None, dtype: torch.dtype,
              device: torch.device) -> TorchPath:
    """The fastest path that runs here: ``ops`` is :func:`native_ops`'s answer (None: torch ops);
    SPECCHAT_NATIVE_DECODER=0 keeps the per-op path."""
    if ops is None:
        return TorchPath(config, layers, dtype, device)
    if os.environ.get("SPECCHAT_NATIVE_DECODER", "1") != "0":
        decoder = NativeDecoder.for_layers(config, layers, ops)
        if decoder is not None:
            return NativeDecoderPath(config, layers, ops, decoder)
    return NativeOpsPath(config, layers, ops)


def native_ops(config: LlamaConfig, layers: Sequence[LayerWeights], lm_head: Linear | StoredLinear
               ) -> NativeKernel | None:
    """Our CPU kernels for norms, activation and attention, where every linear layer is laid out
    for them (CPU, fp32 activations) and every width suits them."""
    linears = [lm_head, *(lin for layer in layers for lin in layer.linears)]
    fits = (all(lin.layout == "native" for lin in linears) and config.hidden_size % 8 == 0
            and config.intermediate_size % 8 == 0 and config.head_dim % 8 == 0)
    return native.load() if fits else None


def attention_mask(span: Span, window: int | None, dtype: torch.dtype, device: torch.device
                   ) -> tuple[torch.Tensor | None, bool]:
    """Additive float mask [T, L+T], or None with is_causal for the cheap cases. ``window``: a
    token sees only keys fewer than this many positions back (None: all)."""
    T, L, positions = span.T, span.length, span.positions
    windowed = window is not None and int(positions.max()) >= window
    if not windowed and span.tree_mask is None and span.prefix_mask is None:
        if T == 1:
            return None, False
        if L == 0:
            return None, True
    block = span.tree_mask if span.tree_mask is not None else torch.ones(T, T, dtype=torch.bool).tril_()
    prefix = span.prefix_mask.cpu() if span.prefix_mask is not None else torch.ones(T, L, dtype=torch.bool)
    allowed = torch.cat([prefix, block.cpu()], dim=1)
    if windowed:
        key_pos = torch.cat([torch.arange(L), positions.cpu()])
        allowed &= (positions.cpu()[:, None] - key_pos[None, :]) < window
    # an additive float mask, built once per forward: a bool mask is converted in every layer
    mask = torch.zeros(T, L + T, dtype=dtype).masked_fill_(~allowed, float("-inf"))
    return mask.to(device), False


def sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, causal: bool,
         scale: float) -> torch.Tensor:
    """q: [T, nh, hd], keys/values: [nkv, L+T, hd] -> [T, nh*hd]."""
    T, nh, hd = q.shape
    att = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0),
        attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=keys.shape[0] != nh,
    )  # [1, nh, T, hd]
    return att[0].transpose(0, 1).reshape(T, nh * hd)
