"""Weights kept in their stored format (quant blocks, f16, bf16) and the layer that multiplies by them.

Why: decoding one token streams every weight once, so bytes per weight set the speed of a CPU
forward. The embedded model is a Q4_1 GGUF (~5 bits a weight); its fp32 conversion reads 4 bytes
a weight for the same numbers. Here a weight matrix is held as

- :class:`QuantRows`: the row-major form every stored format reduces to. Weight (n, k) is
  ``scale[n, k // group] * code[n, k] (+ offset[n, k // group])`` with integer codes (kinds
  ``q8``: int8, ``q4``: 0..15), or a raw 16-bit float (``f16``/``bf16``), or fp32 (``f32``).
  Row permutations (RoPE order) and concatenation (fused q|k|v) act on this form.
- :class:`StoredPanels`: the same numbers repacked for ``stored.c``: 16 output columns side by
  side for each k (q4 codes two k per byte), so the kernel decodes 16 columns with a few vector
  instructions.

The decoded value is bit-for-bit the float32 that gguf-py's ``dequantize`` (today's fp32 path)
gives; see ``stored.c`` for why ``fma(scale, code, offset)`` equals its ``scale * code + offset``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels import native
from engine.kernels.linear import Linear, cpu_layout

PANEL = 16
KIND_IDS = {"f32": 0, "f16": 1, "bf16": 2, "q8": 3, "q4": 4}
_FLOAT_VIEWS = {"f16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class QuantRows:
    """A weight [n, k] in row form; see the module docstring for the meaning of each kind."""

    kind: str
    group: int  # k values sharing one scale/offset (0 for float kinds)
    codes: torch.Tensor  # [n, k]: int8 (q8), uint8 (q4), int16 bit patterns (f16/bf16), float32 (f32)
    scales: torch.Tensor | None = None  # [n, k // group] float32
    offsets: torch.Tensor | None = None  # [n, k // group] float32, or None (no offset)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]

    @classmethod
    def from_tensor(cls, weight: torch.Tensor) -> QuantRows:
        """A plain torch weight as stored: bf16/f16 keep their 2 bytes, anything else is fp32."""
        if weight.dtype in (torch.float16, torch.bfloat16):
            kind = "f16" if weight.dtype == torch.float16 else "bf16"
            return cls(kind, 0, weight.contiguous().view(torch.int16))
        return cls("f32", 0, weight.float().contiguous())

    @classmethod
    def quantize_q8(cls, weight: torch.Tensor, group: int = 32) -> QuantRows:
        """Symmetric 8-bit codes with one scale per ``group`` k (Q8_0's recipe): a quarter of
        fp32's bytes. Lossy, so only for weights whose exact values do not matter to the output
        (a draft head's: drafts are verified)."""
        w = weight.float()
        n, k = w.shape
        if k % group:
            raise ValueError(f"group {group} does not divide k={k}")
        blocks = w.view(n, k // group, group)
        scales = blocks.abs().amax(-1) / 127.0
        codes = torch.round(blocks / scales.clamp_min(1e-30).unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
        return cls("q8", group, codes.view(n, k), scales.contiguous())

    def rows(self, index: torch.Tensor) -> QuantRows:
        """The rows ``index`` (a permutation, or the tokens of an embedding lookup)."""
        pick = (lambda t: None if t is None else t.index_select(0, index))  # noqa: E731
        return QuantRows(self.kind, self.group, pick(self.codes), pick(self.scales), pick(self.offsets))

    def dequantize(self) -> torch.Tensor:
        """[n, k] float32, the exact values of the reference dequantizer."""
        if self.kind == "f32":
            return self.codes
        if self.kind in _FLOAT_VIEWS:
            return self.codes.view(_FLOAT_VIEWS[self.kind]).float()
        scale = self.scales.repeat_interleave(self.group, dim=1)
        w = self.codes.float() * scale  # exact for q4 (<= 21 significant bits); the one rounding for q8
        if self.offsets is not None:
            w = w + self.offsets.repeat_interleave(self.group, dim=1)
        return w

    @property
    def nbytes(self) -> int:
        per_code = 0.5 if self.kind == "q4" else self.codes.element_size()
        extra = sum(t.numel() * 4 for t in (self.scales, self.offsets) if t is not None)
        return int(self.codes.numel() * per_code) + extra


def cat_rows(parts: list[QuantRows]) -> QuantRows | None:
    """The parts stacked by rows, or None when their kinds or groups differ (then keep them apart)."""
    first = parts[0]
    if any(p.kind != first.kind or p.group != first.group or (p.offsets is None) != (first.offsets is None)
           for p in parts):
        return None
    cat = (lambda name: None if getattr(first, name) is None  # noqa: E731
           else torch.cat([getattr(p, name) for p in parts]))
    return QuantRows(first.kind, first.group, cat("codes"), cat("scales"), cat("offsets"))


def _to_panels(t: torch.Tensor, n_pad: int) -> torch.Tensor:
    """[n, c] -> [n_pad/16, c, 16] (zero rows appended), contiguous."""
    if n_pad > t.shape[0]:
        t = torch.cat([t, t.new_zeros(n_pad - t.shape[0], t.shape[1])])
    return t.view(n_pad // PANEL, PANEL, t.shape[1]).transpose(1, 2).contiguous()


def _from_panels(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.transpose(1, 2).reshape(-1, t.shape[1])[:n]


Q4_PER_WORD = 8  # q4 codes of eight consecutive k share one 32-bit word per column
_NIBBLE_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int64).view(1, 1, Q4_PER_WORD, 1)


def _pack_q4_words(codes: torch.Tensor) -> torch.Tensor:
    """[p, k, 16] codes 0..15 -> [p, k/8, 16] int32 words, code[k+i] in bits 4i..4i+3.

    Why words and not bytes: the kernel gets code i with a shift and a mask on eight columns at
    once, where two codes per byte need byte-to-lane shuffles that cost more than the FMAs."""
    p, k, _ = codes.shape
    nibbles = codes.view(p, k // Q4_PER_WORD, Q4_PER_WORD, PANEL)
    words = torch.zeros(p, k // Q4_PER_WORD, PANEL, dtype=torch.int32)
    for i in range(Q4_PER_WORD - 1):  # one int32 slice at a time: no int64 copy of the whole matrix
        words |= nibbles[:, :, i].to(torch.int32) << (4 * i)
    top = (nibbles[:, :, -1].to(torch.int32) ^ 8) - 8  # the last code sign-extended: it fills bit 31
    words |= top * (1 << 28)
    return words


def _unpack_q4_words(words: torch.Tensor) -> torch.Tensor:
    p, kw, _ = words.shape
    nibbles = (words.to(torch.int64).unsqueeze(2) >> _NIBBLE_SHIFTS) & 15
    return nibbles.to(torch.uint8).view(p, kw * Q4_PER_WORD, PANEL)


@dataclass
class StoredPanels:
    """One weight repacked for ``stored.c`` (layout documented there); the same bytes as stored."""

    kind: str
    group: int
    n: int
    k: int
    codes: torch.Tensor  # [n_pad/16, k, 16] (q4: [n_pad/16, k/8, 16] int32, eight k per word)
    scales: torch.Tensor | None  # [n_pad/16, k/group, 16] float32
    offsets: torch.Tensor | None

    @property
    def kind_id(self) -> int:
        return KIND_IDS[self.kind]

    @classmethod
    def from_rows(cls, rows: QuantRows) -> StoredPanels:
        n, k = rows.shape
        step = Q4_PER_WORD if rows.kind == "q4" else 2
        if rows.kind in ("q8", "q4") and (rows.group <= 0 or k % rows.group or rows.group % step):
            raise ValueError(f"group {rows.group} does not divide k={k} evenly (nor is a multiple of {step})")
        n_pad = -(-n // PANEL) * PANEL
        codes = _to_panels(rows.codes, n_pad)
        if rows.kind == "q4":
            codes = _pack_q4_words(codes)
        scales = _to_panels(rows.scales, n_pad) if rows.scales is not None else None
        offsets = _to_panels(rows.offsets, n_pad) if rows.offsets is not None else None
        return cls(rows.kind, rows.group, n, k, codes, scales, offsets)

    def to_rows(self) -> QuantRows:
        codes = self.codes
        if self.kind == "q4":
            codes = _unpack_q4_words(codes)
        unpack = (lambda t: None if t is None else _from_panels(t, self.n))  # noqa: E731
        return QuantRows(self.kind, self.group, _from_panels(codes, self.n), unpack(self.scales), unpack(self.offsets))

    def dequantize(self) -> torch.Tensor:
        return self.to_rows().dequantize()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.offsets) if t is not None)


class StoredLinear:
    """``y = x @ W.T + b`` with W in its stored format; the drop-in twin of :class:`Linear`.

    ``parts`` are stacked by rows (q|k|v may mix formats in a Q4_K_M file); each part writes its
    own columns of the output. With our kernel every output element is the FMA chain the fp32
    kernel computes on the dequantized weights. Without it (no compiler, no AVX2), the weight is
    dequantized for each call and multiplied exactly as the fp32 fallback would: slow, same answers.
    """

    __slots__ = ("_bias", "_kernel", "fast", "in_features", "layout", "out_features", "parts")

    def __init__(self, parts: list[QuantRows], bias: torch.Tensor | None = None) -> None:
        merged = cat_rows(parts)
        self.parts = [StoredPanels.from_rows(p) for p in ([merged] if merged is not None else parts)]
        self.in_features = self.parts[0].k
        self.out_features = sum(p.n for p in self.parts)
        self._bias = bias.float().contiguous() if bias is not None else None
        self.layout = cpu_layout()
        self._kernel = native.load() if self.layout == "native" else None
        self.fast = False  # the fast precision (engine/kernels/fast.c) for q4/q8 parts; set by the model

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def dense_weight(self) -> torch.Tensor:
        """The weight as an ordinary fp32 [out, in] tensor (a fresh copy)."""
        return torch.cat([p.dequantize() for p in self.parts])

    def _native(self, x: torch.Tensor, out: torch.Tensor, accumulate: bool) -> None:
        col = 0
        for part in self.parts:
            bias = self._bias[col : col + part.n] if self._bias is not None else None
            view = out[:, col : col + part.n]
            if not (self.fast and self._kernel.stored_linear_fast(x, part, bias, view, accumulate)):
                self._kernel.stored_linear(x, part, bias, view, accumulate)
            col += part.n

    def _fallback(self) -> Linear:
        return Linear(self.dense_weight, self._bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if self._kernel is None or rows.dtype != torch.float32:
            return self._fallback()(x)
        y = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        self._native(rows.contiguous(), y, accumulate=False)
        return y.reshape(*lead, self.out_features)

    def add_into(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``residual += x @ W.T + b`` in place (2-D fp32); returns residual."""
        if self._kernel is not None and x.dtype == torch.float32 and residual.is_contiguous():
            self._native(x.contiguous(), residual, accumulate=True)
            return residual
        return residual.add_(self(x))


class StoredEmbedding:
    """Token embedding lookup from stored rows: only the looked-up rows are decoded."""

    def __init__(self, rows: QuantRows) -> None:
        self.rows = rows

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows.shape

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        flat = tokens.reshape(-1).to("cpu", torch.int64)
        return self.rows.rows(flat).dequantize().reshape(*tokens.shape, -1)
