"""One Llama decoder layer's weights, the math every forward path shares, and a forward's output.

Why apart from ``llama.py``: the model's layer paths (``paths.py``), CUDA's static-shape forward
(engine/gpu/static.py), EAGLE heads (engine/drafters/eagle_head.py) and the transformers adapter
(``hf.py``) all need these pieces; here they import them without importing the model (or each
other). The layer weights are fused (q|k|v, gate|up) so each layer is three matrix products and
a handful of elementwise ops.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from engine.gpu.rms_norm import rms_norm
from engine.kernels.linear import Linear
from engine.kernels.stored import StoredLinear
from engine.kernels.weights import QuantRows
from engine.models.llama_config import LlamaConfig
from engine.models.rope import apply_rotary_interleaved, interleave_halves


@dataclass
class ForwardOutput:
    """What a target model's forward returns, whichever model or path computed it."""

    logits: torch.Tensor | None  # [T, V] float32, or [1, V] when only the last row was asked for
    hidden: torch.Tensor | None = None  # [T, H] last layer after the final norm (EAGLE-1/2 feature)
    aux: list[torch.Tensor] = field(default_factory=list)  # residual entering each captured layer


class LayerWeights:
    """One decoder layer, q/k rows in the rotation-friendly (interleaved) order."""

    __slots__ = ("down", "gate_up", "k_norm", "ln_attn", "ln_mlp", "o", "q_norm", "qkv")

    def __init__(self, sd: Mapping[str, Any], prefix: str, config: LlamaConfig, dtype: torch.dtype,
                 device: torch.device, stored: bool = False) -> None:
        hd = config.head_dim
        heads = {"q": config.num_heads, "k": config.num_kv_heads}

        def w(name: str) -> Any:
            t = as_weight(sd[prefix + name], stored and name.endswith("_proj.weight"), dtype, device)
            # q/k rows (and biases, and q/k norm weights) go into the rotation-friendly order
            proj = name.split(".")[1][0] if name.startswith("self_attn.") else ""
            if proj in heads and (name.endswith("_proj.weight") or name.endswith("_proj.bias")):
                return interleave_rows(t, heads[proj], hd)
            if proj in heads and name.endswith("_norm.weight"):
                return interleave_halves(t, 1, hd)
            return t

        def maybe(name: str) -> torch.Tensor | None:
            return w(name) if prefix + name in sd else None

        att = "self_attn."
        qkv_w = [w(att + "q_proj.weight"), w(att + "k_proj.weight"), w(att + "v_proj.weight")]
        biases = [maybe(att + f"{p}_proj.bias") for p in "qkv"]
        qkv_b = None
        if any(b is not None for b in biases):
            rows = [w(att + f"{p}_proj.weight").shape[0] for p in "qkv"]
            qkv_b = torch.cat([b if b is not None else torch.zeros(r, dtype=dtype, device=device)
                               for b, r in zip(biases, rows, strict=True)])
        self.qkv = make_linear(qkv_w, qkv_b)
        self.o = make_linear([w(att + "o_proj.weight")], maybe(att + "o_proj.bias"))
        self.q_norm = maybe(att + "q_norm.weight")
        self.k_norm = maybe(att + "k_norm.weight")
        gate_up_b = maybe("mlp.gate_proj.bias")
        if gate_up_b is not None:
            gate_up_b = torch.cat([gate_up_b, w("mlp.up_proj.bias")])
        self.gate_up = make_linear([w("mlp.gate_proj.weight"), w("mlp.up_proj.weight")], gate_up_b)
        self.down = make_linear([w("mlp.down_proj.weight")], maybe("mlp.down_proj.bias"))
        self.ln_attn = w("input_layernorm.weight")
        self.ln_mlp = w("post_attention_layernorm.weight")

    @property
    def linears(self) -> tuple[Linear | StoredLinear, ...]:
        return self.qkv, self.o, self.gate_up, self.down

    def project(self, h: torch.Tensor, rot: torch.Tensor, config: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed input h [T, H] -> (q|k rotated [T, nh + nkv, hd], v [T, nkv, hd])."""
        T = h.shape[0]
        nh, nkv, hd = config.num_heads, config.num_kv_heads, config.head_dim
        k_end = (nh + nkv) * hd
        qkv = self.qkv(h)
        qk = qkv[:, :k_end].view(T, nh + nkv, hd)
        if self.q_norm is not None:
            eps = config.rms_norm_eps
            qk = torch.cat([rms_norm(qk[:, :nh], self.q_norm, eps), rms_norm(qk[:, nh:], self.k_norm, eps)], dim=1)
        return apply_rotary_interleaved(qk, rot), qkv[:, k_end:].view(T, nkv, hd)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        """The SwiGLU block on normed input h, in torch ops."""
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


def as_weight(t: Any, keep_stored: bool, dtype: torch.dtype, device: torch.device) -> Any:
    """A state-dict value as the model holds it: QuantRows (stored mode, matrix weights; bf16/f16
    tensors are kept as 2-byte rows), else a dense tensor of ``dtype`` on ``device``."""
    if keep_stored:
        return t if isinstance(t, QuantRows) else QuantRows.from_tensor(t)
    if isinstance(t, QuantRows):
        t = t.dequantize()
    return t.to(device=device, dtype=dtype)


def interleave_rows(t: Any, num_heads: int, head_dim: int) -> Any:
    """q/k projection rows in the rotation-friendly order, for a tensor or stored rows."""
    if isinstance(t, QuantRows):
        return t.rows(interleave_halves(torch.arange(t.shape[0]), num_heads, head_dim))
    return interleave_halves(t, num_heads, head_dim)


def make_linear(parts: list[Any], bias: torch.Tensor | None) -> Linear | StoredLinear:
    """One layer from weights stacked by rows: fp32 panels for tensors, stored panels for QuantRows."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return Linear(parts[0] if len(parts) == 1 else torch.cat(parts), bias)
    return StoredLinear([p if isinstance(p, QuantRows) else QuantRows.from_tensor(p) for p in parts], bias)
