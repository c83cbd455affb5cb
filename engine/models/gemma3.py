"""Our own forward for Gemma 3 (the text model: 270M, 1B, and the text stack of the larger ones).

Why a subclass of :class:`LlamaModel` rather than a model of its own: a Gemma 3 layer is a
Llama layer with more norms around the same products, so the cache, the tree spans, the stored
weights, the LM head and the session-facing interface (forward, new_cache, embed_tokens, ...)
are all the Llama model's. What differs, and lives here:

- every RMS norm multiplies by ``1 + w`` (the checkpoint stores ``w``); we add the 1 once, at
  load, in float32 as transformers does, so the plain norm kernels run unchanged;
- a norm after attention and one after the feed-forward block, besides the two before them;
- GeGLU with the tanh-approximated GELU instead of SwiGLU;
- the embedding scaled by sqrt(hidden) (a float32 scalar, as transformers' buffer holds it);
- local/global attention: most layers see a sliding window and rotate with their own RoPE base,
  every sixth (``layer_types``) sees everything with the global base;
- attention scaled by ``query_pre_attn_scalar ** -0.5``; optional tanh soft-capping of the final
  logits. (Gemma 3 configs may carry ``attn_logit_softcapping``, a Gemma 2 leftover that neither
  transformers' Gemma 3 nor llama.cpp applies; we follow them and ignore it.)

The one-call native decoder (decoder.c) is Llama-shaped, so Gemma runs our kernels op by op (or
torch ops), never that path, and never CUDA's static-shape forward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine.models.kv_cache import KVCache
from engine.models.layer import LayerWeights
from engine.models.llama import LlamaModel
from engine.models.llama_config import LlamaConfig, UnsupportedModelError, shape_fields
from engine.models.paths import Attend, NativeOpsPath, Span, TorchPath
from engine.models.rope import RotaryTable, rope_inv_freq

GEMMA3_TYPES = ("gemma3_text",)
_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


@dataclass(frozen=True, kw_only=True)
class Gemma3Config(LlamaConfig):
    """A Gemma 3 text config: the Llama fields (``rope_theta``: the global layers' base,
    ``sliding_window``: the local layers' window) plus the layer pattern and Gemma's scalars."""

    layer_types: tuple[str, ...] = ()
    rope_local_theta: float = 10000.0
    query_pre_attn_scalar: float = 256.0
    final_logit_softcapping: float | None = None

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types[layer] == "sliding_attention"

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any]) -> Gemma3Config:
        model_type = str(d.get("model_type", "")).lower()
        if model_type not in GEMMA3_TYPES:
            raise UnsupportedModelError(f"model type {model_type!r} is not a Gemma 3 text model")
        if d.get("use_bidirectional_attention"):
            raise UnsupportedModelError("bidirectional Gemma 3 (an embedding model) is not a chat model; "
                                        "use --backend hf")
        act = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in _GELU_TANH:
            raise UnsupportedModelError(f"Gemma 3 with activation {act!r} is not supported; use --backend hf")
        full, local = _rope_parameters(d)
        flat = {k: v for k, v in d.items() if k not in ("rope_parameters", "rope_scaling")}
        flat.update(rope_theta=full.get("rope_theta", 1_000_000.0), head_dim=d.get("head_dim") or 256)
        scaling = {k: v for k, v in full.items() if k != "rope_theta"}
        if scaling.get("rope_type", scaling.get("type", "default")) != "default":
            flat["rope_scaling"] = scaling
        layers = int(d["num_hidden_layers"])
        eos = d.get("eos_token_id", 1)
        window = d.get("sliding_window") or 4096
        return cls(
            **shape_fields(flat, max_positions=131072),
            model_type=model_type,
            num_layers=layers,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
            sliding_window=int(window),
            qk_norm=True,
            eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ()),
            bos_token_id=d.get("bos_token_id", 2),
            layer_types=_layer_types(d, layers),
            rope_local_theta=float(local.get("rope_theta", 10000.0)),
            query_pre_attn_scalar=float(d.get("query_pre_attn_scalar") or 256),
            final_logit_softcapping=_optional_float(d.get("final_logit_softcapping")),
        )


def _rope_parameters(d: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(global, local) RoPE parameters from either config format: transformers 5 writes
    ``rope_parameters`` keyed by layer type; older configs (and the Hub's) write ``rope_theta``,
    ``rope_local_base_freq`` and ``rope_scaling``."""
    params = d.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        return dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
    full: dict[str, Any] = dict(d.get("rope_scaling") or {})
    full["rope_theta"] = float(d.get("rope_theta") or params.get("rope_theta") or 1_000_000.0)
    return full, {"rope_theta": float(d.get("rope_local_base_freq") or 10000.0)}


def _layer_types(d: Mapping[str, Any], layers: int) -> tuple[str, ...]:
    """Each layer's attention kind, read as transformers reads it: ``layer_types``, else every
    ``sliding_window_pattern``-th layer (default 6) global and the others local."""
    given = d.get("layer_types")
    if given:
        if len(given) != layers or any(t not in ("sliding_attention", "full_attention") for t in given):
            raise ValueError(f"layer_types must name sliding_attention or full_attention for each of {layers} layers")
        return tuple(given)
    pattern = int(d.get("sliding_window_pattern") or 6)
    return tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers))


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def plus_one(weight: torch.Tensor) -> torch.Tensor:
    """A Gemma norm weight ``w`` as the factor it applies, ``1 + w`` (computed in float32)."""
    return (1.0 + weight.float()).to(weight.dtype)


class Gemma3LayerWeights(LayerWeights):
    """One Gemma 3 layer: the Llama layer's products plus the post-attention and post-feed-forward
    norms. ``ln_attn``/``ln_mlp`` are the norms before attention and the feed-forward block,
    ``post_attn``/``post_mlp`` the ones after; every norm holds ``1 + w``."""

    __slots__ = ("post_attn", "post_mlp")

    def __init__(self, sd: Mapping[str, Any], prefix: str, config: LlamaConfig, dtype: torch.dtype,
                 device: torch.device, stored: bool = False) -> None:
        super().__init__(sd, prefix, config, dtype, device, stored)
        # the Llama reader took post_attention_layernorm as ln_mlp: in Gemma it follows attention
        self.post_attn = plus_one(self.ln_mlp)
        self.ln_attn = plus_one(self.ln_attn)
        self.q_norm = plus_one(self.q_norm)
        self.k_norm = plus_one(self.k_norm)

        def norm(name: str) -> torch.Tensor:
            return plus_one(sd[prefix + name].to(device=device, dtype=dtype))

        self.ln_mlp = norm("pre_feedforward_layernorm.weight")
        self.post_mlp = norm("post_feedforward_layernorm.weight")

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        """GeGLU with the tanh-approximated GELU (transformers' gelu_pytorch_tanh)."""
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return self.down(F.gelu(gate, approximate="tanh") * up)


class _Gemma3Layers:
    """What a Gemma 3 layer path does differently; mixed into the torch and the per-op path."""

    config: Gemma3Config

    def _rot(self, span: Span, li: int) -> torch.Tensor:
        """The local table on sliding layers (Gemma3Model._span fills it in), the global one else."""
        if not self.config.is_sliding(li):
            return span.rot
        if span.rot_local is None:
            raise RuntimeError("a Gemma 3 forward needs the sliding layers' rotations (Span.rot_local)")
        return span.rot_local

    def _attention(self, span: Span) -> Attend:
        """Windowed attention on the local layers, full attention on the global ones."""
        local = self._attend(span, self.config.sliding_window)
        full = self._attend(span, None)

        def attend(q: torch.Tensor, li: int, cache: KVCache) -> torch.Tensor:
            return (local if self.config.is_sliding(li) else full)(q, li, cache)

        return attend

    def _finish(self, layer: Gemma3LayerWeights, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """Output projection and feed-forward block, each normed before being added."""
        norm = self.rms_norm  # type: ignore[attr-defined]
        x = x + norm(layer.o(att), layer.post_attn)
        return x + norm(layer.mlp(norm(x, layer.ln_mlp)), layer.post_mlp)


class Gemma3TorchPath(_Gemma3Layers, TorchPath):
    """Gemma 3 layers in torch ops (any device and dtype)."""


class Gemma3NativePath(_Gemma3Layers, NativeOpsPath):
    """Gemma 3 layers on our CPU kernels op by op (norms, attention, products)."""


class Gemma3Model(LlamaModel):
    """A Gemma 3 causal LM with the Llama model's interface (see the module docstring)."""

    layer_type = Gemma3LayerWeights
    static_decoder = False
    config: Gemma3Config

    def __init__(self, config: Gemma3Config, state_dict: MutableMapping[str, Any], **kwargs: Any) -> None:
        super().__init__(config, state_dict, **kwargs)
        self.norm = plus_one(self.norm)
        inv_freq, factor = rope_inv_freq(config.head_dim, config.rope_local_theta, None,
                                         config.max_position_embeddings)
        self.local_rotary = RotaryTable(inv_freq, factor, self.device)
        # transformers keeps sqrt(hidden) as a float32 buffer and casts it to the weights' dtype
        self.embed_scale = torch.tensor(math.sqrt(config.hidden_size), dtype=torch.float32).to(self.dtype)

    def _make_path(self) -> TorchPath:
        """Our kernels op by op where they fit, else torch ops; never the one-call decoder."""
        c = self.config
        if self.ops is None:
            path: TorchPath = Gemma3TorchPath(c, self.layers, self.dtype, self.device)
        else:
            path = Gemma3NativePath(c, self.layers, self.ops)
        path.scale = c.query_pre_attn_scalar**-0.5
        return path

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """The scaled embedding, as Gemma's embedding module returns it."""
        return super().embed_tokens(tokens) * self.embed_scale.to(tokens.device)

    def embed_rows(self, tokens: torch.Tensor | list[int]) -> torch.Tensor:
        """The scaled rows (the base class's one-call lookup would skip the scale)."""
        ids = tokens if isinstance(tokens, torch.Tensor) else torch.tensor(tokens, dtype=torch.int64)
        return self.embed_tokens(ids).float().contiguous()

    def logits_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().logits_from_hidden(hidden)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _span(self, T: int, cache: KVCache, positions: torch.Tensor | None, tree_mask: torch.Tensor | None,
              prefix_mask: torch.Tensor | None) -> Span:
        span = super()._span(T, cache, positions, tree_mask, prefix_mask)
        self.local_rotary.ensure(int(span.positions.max()) + 1)
        span.rot_local = self.local_rotary.lookup(span.positions)
        return span
