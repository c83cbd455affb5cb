"""Weights kept in their stored format (quant blocks, f16, bf16): the row form and the panel form.

Why: decoding one token streams every weight once, so bytes per weight set the speed of a CPU
forward. The embedded model is a Q4_1 GGUF (~5 bits a weight); its fp32 conversion reads 4 bytes
a weight for the same numbers. A weight matrix is held as

- :class:`QuantRows`: the row-major form every stored format reduces to. Weight (n, k) is
  ``scale[n, k // group] * code[n, k] (+ offset[n, k // group])`` with integer codes (kinds
  ``q8``: int8, ``q4``: 0..15), or a raw 16-bit float (``f16``/``bf16``), or fp32 (``f32``).
  Row permutations (RoPE order) and concatenation (fused q|k|v) act on this form.
- :class:`StoredPanels`: the same numbers repacked for ``stored.c``: 16 output columns side by
  side for each k, so the kernel decodes 16 columns with a few vector instructions. q4 codes go
  eight k to a 32-bit word per column (code[k+i] in bits 4i..4i+3): one shift and one mask
  take a code out of eight columns at once.

The decoded value is bit-for-bit the float32 that gguf-py's ``dequantize`` (today's fp32 path)
gives; see ``stored.c`` for why ``fma(scale, code, offset)`` equals its ``scale * code + offset``.
This module is the format only; ``stored.py`` holds the layer that multiplies by it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PANEL = 16  # output columns per panel (fixed by stored.c)
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
        """Symmetric 8-bit codes with one scale per ``group`` k (Q8_0's recipe, the scale an fp16
        value as there, so the fast products read it from an fp16 copy): a quarter of fp32's
        bytes. Lossy, so only for weights whose exact values do not matter to the output (a draft
        head's: drafts are verified)."""
        w = weight.float()
        n, k = w.shape
        if k % group:
            raise ValueError(f"group {group} does not divide k={k}")
        blocks = w.view(n, k // group, group)
        scales = _fp16_at_least(blocks.abs().amax(-1) / 127.0)
        codes = torch.round(blocks / scales.clamp_min(1e-30).unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
        return cls("q8", group, codes.view(n, k), scales.contiguous())

    @classmethod
    def quantize_q4(cls, weight: torch.Tensor, group: int = 32) -> QuantRows:
        """Asymmetric 4-bit codes with a scale and an offset per ``group`` k (Q4_1's recipe, both
        fp16 values as there; the offset rounded down and the scale up, so the block still fits 16
        levels): an eighth of fp32's bytes. Lossy, for draft heads only, like :meth:`quantize_q8`."""
        w = weight.float()
        n, k = w.shape
        if k % group:
            raise ValueError(f"group {group} does not divide k={k}")
        blocks = w.view(n, k // group, group)
        low, high = -_fp16_at_least(-blocks.amin(-1)), blocks.amax(-1)
        scales = _fp16_at_least((high - low) / 15.0)
        codes = torch.round((blocks - low.unsqueeze(-1)) / scales.clamp_min(1e-30).unsqueeze(-1)).clamp_(0, 15)
        return cls("q4", group, codes.to(torch.uint8).view(n, k), scales.contiguous(), low.contiguous())

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
        n, k = self.codes.shape
        # each group's scale broadcast over its codes (no repeated copy: an embedding lookup per
        # drafted level is on the critical path)
        w = self.codes.view(n, k // self.group, self.group).float() * self.scales.unsqueeze(-1)
        if self.offsets is not None:  # the product is exact for q4 (<= 21 significant bits); one rounding for q8
            w = w + self.offsets.unsqueeze(-1)
        return w.view(n, k)

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


def _fp16_at_least(t: torch.Tensor) -> torch.Tensor:
    """The least fp16 value >= each of ``t``'s (finite, below 65504), as float32."""
    half = t.half()
    up = torch.nextafter(half, torch.full_like(half, float("inf")))
    return torch.where(half.float() < t, up, half).float()


def _exact_half(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` as fp16 when every value survives the round trip (None otherwise, or for None)."""
    if t is None:
        return None
    half = t.half()
    return half if torch.equal(half.float(), t) else None


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
    # fp16 copies of scales and offsets where every value is exactly an fp16 (the GGUF kinds store
    # them so): the fast products read these, a third fewer bytes a step for Q4_1 layers, the same
    # floats once widened. None where some value is not.
    scales16: torch.Tensor | None = None
    offsets16: torch.Tensor | None = None

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
        scales16 = _exact_half(scales) if rows.kind in ("q4", "q8") else None
        offsets16 = _exact_half(offsets)
        if scales16 is None or (offsets is not None and offsets16 is None):  # both copies or neither
            scales16 = offsets16 = None
        return cls(rows.kind, rows.group, n, k, codes, scales, offsets, scales16, offsets16)

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
        """Bytes the exact products read (codes, fp32 scales and offsets)."""
        return _nbytes(self.codes, self.scales, self.offsets)

    @property
    def fast_nbytes(self) -> int:
        """Bytes the fast products read: the fp16 copies of the scales where there are some."""
        return self.nbytes if self.scales16 is None else _nbytes(self.codes, self.scales16, self.offsets16)


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
