"""Rotary position embeddings: the inverse frequencies of each scaling variant the Llama family uses.

Kept apart from the forward because it is the part most likely to differ silently between model
releases; the tests compare every variant against transformers.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from engine.models.llama_config import DecoderShape


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None, max_positions: int
                  ) -> tuple[torch.Tensor, float]:
    """Return (inv_freq [head_dim/2] float64, attention_factor applied to cos/sin)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    if kind == "default":
        return inv_freq, 1.0
    factor = float(scaling["factor"])  # type: ignore[index]
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "dynamic":
        # Dynamic NTK only changes the base past max_position_embeddings; specchat sizes its
        # context below that (checked at load), where it equals the default.
        return inv_freq, 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling), 1.0  # type: ignore[arg-type]
    if kind == "yarn":
        return _yarn(head_dim, theta, scaling, max_positions)  # type: ignore[arg-type]
    raise ValueError(f"unsupported rope scaling type {kind!r}")


def _llama3(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor = float(s["factor"])
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_ctx = float(s.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(head_dim: int, theta: float, s: dict[str, Any], max_positions: int) -> tuple[torch.Tensor, float]:
    factor = float(s["factor"])
    orig = int(s.get("original_max_position_embeddings") or max_positions)
    beta_fast, beta_slow = float(s.get("beta_fast") or 32), float(s.get("beta_slow") or 1)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            attention_factor = mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    pos_freqs = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


class RotaryTable:
    """Rotation factors by position as complex numbers, grown on demand.

    The model stores q/k weights with each head's two halves interleaved (see
    :func:`interleave_halves`), so rotating a head is one complex multiply over adjacent pairs
    instead of the slice-negate-concatenate of the rotate-half form: one op for q and k together.
    """

    def __init__(self, inv_freq: torch.Tensor, attention_factor: float, device: torch.device) -> None:
        self.inv_freq = inv_freq.to(torch.float64)
        self.attention_factor = attention_factor
        self.device = device
        self.table = torch.empty(0, dtype=torch.complex64, device=device)

    @classmethod
    def for_shape(cls, shape: DecoderShape, device: torch.device) -> RotaryTable:
        """The table a decoder of this shape (a target model, an EAGLE head) rotates with."""
        inv_freq, factor = rope_inv_freq(shape.head_dim, shape.rope_theta, shape.rope_scaling,
                                         shape.max_position_embeddings)
        return cls(inv_freq, factor, device)

    def ensure(self, length: int) -> None:
        if length <= self.table.shape[0]:
            return
        length = max(length, 2 * self.table.shape[0], 256)
        angles = torch.outer(torch.arange(length, dtype=torch.float64), self.inv_freq)
        table = torch.polar(torch.full_like(angles, self.attention_factor), angles)
        self.table = table.to(torch.complex64).to(self.device)

    def lookup(self, positions: torch.Tensor) -> torch.Tensor:
        """[T, 1, head_dim/2] complex factors for the given positions (broadcast over heads)."""
        return self.table[positions].unsqueeze(1)


def apply_rotary_interleaved(x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim] with interleaved halves; returns the rotated copy (same layout)."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * factors).flatten(-2).to(x.dtype)


def interleave_halves(weight: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Reorder each head's rows (or entries) from [a0..a_{d/2-1}, b0..] to [a0, b0, a1, b1, ...].

    Attention scores are dot products over the head dimension, so applying the same reordering to
    q and k changes nothing but lets the rotation pair adjacent entries.
    """
    rest = weight.shape[1:]
    w = weight.reshape(num_heads, 2, head_dim // 2, *rest)
    return w.transpose(1, 2).reshape(num_heads * head_dim, *rest)
