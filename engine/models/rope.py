"""Rotary position embeddings: the inverse frequencies of each scaling variant the Llama family uses.

Kept apart from the forward because it is the part most likely to differ silently between model
releases; the tests compare every variant against transformers.
"""

from __future__ import annotations

import math
from typing import Any

import torch


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
    """cos/sin rows by position, grown on demand, in the model's dtype."""

    def __init__(self, inv_freq: torch.Tensor, attention_factor: float, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.inv_freq = inv_freq.to(torch.float32)
        self.attention_factor = attention_factor
        self.dtype, self.device = dtype, device
        self.cos = torch.empty(0, device=device)
        self.sin = torch.empty(0, device=device)

    def ensure(self, length: int) -> None:
        if length <= self.cos.shape[0]:
            return
        length = max(length, 2 * self.cos.shape[0], 256)
        t = torch.arange(length, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = (emb.cos() * self.attention_factor).to(self.dtype).to(self.device)
        self.sin = (emb.sin() * self.attention_factor).to(self.dtype).to(self.device)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin of shape [T, head_dim] for the given positions."""
        return self.cos[positions], self.sin[positions]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [heads, T, head_dim]; cos/sin: [T, head_dim] (rotate-half convention, as in HF Llama)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
