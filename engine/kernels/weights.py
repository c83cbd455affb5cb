"""Weights kept in their stored format (quant blocks, f16, bf16): the row form and the panel form.

Why: decoding one token streams every weight once, so bytes per weight set the speed of a CPU
forward. The embedded model is a Q4_1 GGUF (~5 bits a weight); its fp32 conversion reads 4 bytes
a weight for the same numbers. A weight matrix is held as

- :class:`QuantRows`: the row-major form every stored format reduces to. Weight (n, k) is
  ``scale[n, k // group] * code[n, k] (+ offset[n, k // group])`` with integer codes (kinds
  ``q8``: int8, ``q4``: 0..15), or ``scale * (code - 32)`` with codes 0..63 (``q6``: Q6_K's own
  codes, the q8 form's plus 32), or a raw 16-bit float (``f16``/``bf16``), or fp32 (``f32``).
  Row permutations (RoPE order) and concatenation (fused q|k|v) act on this form.
- :class:`StoredPanels`: the same numbers repacked for ``stored.c``: 16 output columns side by
  side for each k, so the kernel decodes 16 columns with a few vector instructions. q4 codes go
  eight k to a 32-bit word per column (code[k+i] in bits 4i..4i+3): one shift and one mask
  take a code out of eight columns at once. q6 codes go in blocks of 16 k: the low four bits as
  two q4 words per column, then one word per column of the 16 high two-bit pairs (:func:`_pack_q6`
  says where each goes): 6 bits a weight where the q8 form read 8.

The kernels read the scales and offsets from compact copies where the same floats come from fewer
bytes (fp16 copies, or a K-quant's own factoring; ``StoredPanels.scale_form``, ``scales.h``).

The decoded value is bit-for-bit the float32 that gguf-py's ``dequantize`` (today's fp32 path)
gives; see ``stored.c`` for why ``fma(scale, code, offset)`` equals its ``scale * code + offset``.
This module is the format only; ``stored.py`` holds the layer that multiplies by it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

PANEL = 16  # output columns per panel (fixed by stored.c)
KIND_IDS = {"f32": 0, "f16": 1, "bf16": 2, "q8": 3, "q4": 4, "q6": 5}
QUANT_KINDS = ("q8", "q4", "q6")  # the kinds with integer codes and per-group scales
Q6_BIAS = 32  # a q6 code is its q8 value + 32
_FLOAT_VIEWS = {"f16": torch.float16, "bf16": torch.bfloat16}
SCALES_F16, SCALES_FACTORED = 1, 2  # StoredPanels.scale_form: fp16 copies; factored, + log2(groups a factor)


@dataclass
class QuantRows:
    """A weight [n, k] in row form; see the module docstring for the meaning of each kind."""

    kind: str
    group: int  # k values sharing one scale/offset (0 for float kinds)
    codes: torch.Tensor  # [n, k]: int8 (q8), uint8 (q4, q6), int16 bit patterns (f16/bf16), float32 (f32)
    scales: torch.Tensor | None = None  # [n, k // group] float32
    offsets: torch.Tensor | None = None  # [n, k // group] float32, or None (no offset)
    # A K-quant's scales as its file stores them, where the reader has them (gguf_weights.py):
    # scales[:, g] == scale_base[:, g // per] * scale_sub[:, g] in fp32 (per: the groups of a
    # super-block), likewise the offsets. Bases [n, k // (group * per)] float32 holding fp16
    # values, subs [n, k // group] int8. A hint: StoredPanels checks it before it relies on it.
    scale_base: torch.Tensor | None = None
    scale_sub: torch.Tensor | None = None
    offset_base: torch.Tensor | None = None
    offset_sub: torch.Tensor | None = None

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
        value as there, so the products read it from an fp16 copy): a quarter of fp32's
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

    def to_q6(self) -> QuantRows:
        """This q8 weight as kind q6 (each code + 32, the scales kept): the same values at 6 bits a
        weight. Only where every code lies in -32..31 (Q6_K's): ValueError otherwise."""
        if self.kind != "q8":
            raise ValueError(f"only q8 weights become q6, not {self.kind!r}")
        if self.codes.numel() and not (int(self.codes.min()) >= -Q6_BIAS and int(self.codes.max()) < Q6_BIAS):
            raise ValueError("q8 codes outside -32..31 do not fit 6 bits")
        return replace(self, kind="q6", codes=(self.codes + Q6_BIAS).view(torch.uint8))

    def to_q8(self) -> QuantRows:
        """A q6 weight as the q8 form of the same values (each code - 32): what the fast precision's
        definition (fast.py) multiplies, as every kernel variant does in effect."""
        if self.kind != "q6":
            raise ValueError(f"to_q8 takes q6 weights, not {self.kind!r}")
        return replace(self, kind="q8", codes=(self.codes.view(torch.int8) - Q6_BIAS))

    def rows(self, index: torch.Tensor) -> QuantRows:
        """The rows ``index`` (a permutation, or the tokens of an embedding lookup)."""
        return QuantRows(self.kind, self.group, *(None if t is None else t.index_select(0, index)
                                                  for t in self._tensors()))

    def _tensors(self) -> list[torch.Tensor | None]:
        """The per-row tensors in field order (codes first): what rows() and cat_rows() act on."""
        return [getattr(self, name) for name in _ROW_TENSORS]

    def dequantize(self) -> torch.Tensor:
        """[n, k] float32, the exact values of the reference dequantizer."""
        if self.kind == "f32":
            return self.codes
        if self.kind in _FLOAT_VIEWS:
            return self.codes.view(_FLOAT_VIEWS[self.kind]).float()
        n, k = self.codes.shape
        # each group's scale broadcast over its codes (no repeated copy: an embedding lookup per
        # drafted level is on the critical path)
        codes = self.codes.view(n, k // self.group, self.group).float()
        if self.kind == "q6":  # code - 32 is exact: the q8 form's value, one rounding in the product
            codes -= Q6_BIAS
        w = codes * self.scales.unsqueeze(-1)
        if self.offsets is not None:  # the product is exact for q4 (<= 21 significant bits); one rounding for q8
            w = w + self.offsets.unsqueeze(-1)
        return w.view(n, k)

    @property
    def nbytes(self) -> int:
        per_code = {"q4": 0.5, "q6": 0.75}.get(self.kind, self.codes.element_size())
        extra = sum(t.numel() * 4 for t in (self.scales, self.offsets) if t is not None)
        return int(self.codes.numel() * per_code) + extra


_ROW_TENSORS = ("codes", "scales", "offsets", "scale_base", "scale_sub", "offset_base", "offset_sub")


def cat_rows(parts: list[QuantRows]) -> QuantRows | None:
    """The parts stacked by rows, or None when their kinds or groups differ (then keep them apart).
    The factored scales survive where every part has them in the same shape, else they are dropped
    (the fp32 scales say the same)."""
    first = parts[0]
    if any(p.kind != first.kind or p.group != first.group or (p.offsets is None) != (first.offsets is None)
           for p in parts):
        return None
    columns = list(zip(*(p._tensors() for p in parts), strict=True))
    tensors = [None if any(t is None for t in col) else torch.cat(col) for col in columns[:3]]
    factored = [None if any(t is None or t.shape[1:] != col[0].shape[1:] for t in col) else torch.cat(col)
                for col in columns[3:]]
    return QuantRows(first.kind, first.group, *tensors, *factored)


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


Q6_BLOCK = 16  # q6 codes are packed in blocks of 16 k: two q4 words and one word of high bits a column


def _q6_high_shift(t: int) -> int:
    """Where the high two bits of the code at k offset t (0..15) of a q6 block sit in its high word.

    Why this order: the fast tile (fast.c) reads the block's four registers of byte codes from the
    two q4 words (low nibbles: even k, then odd k, as q4 does), and byte b of register j (j = 2w + e
    for word w, even/odd e) needs the high bits of k = 8w + 2b + e. Keeping them in byte b, bits
    2j..2j+1, lets one shift of the whole word (left 4, left 2, none, right 2) bring register j's
    bits to bits 4-5 of every byte, where one masked merge joins them to the low nibbles."""
    w, i = divmod(t, 8)
    b, e = divmod(i, 2)
    return 8 * b + 2 * (2 * w + e)


def _or_field(word: torch.Tensor, value: torch.Tensor, shift: int, width: int) -> None:
    """word |= value << shift in int32, where the field may end at bit 31 (then sign-extended)."""
    if shift + width == 32:
        top = 1 << (width - 1)
        value = ((value ^ top) - top) * (1 << shift)  # the field's top bit is bit 31: a negative int32
    else:
        value = value << shift
    word |= value


def _pack_q6(codes: torch.Tensor) -> torch.Tensor:
    """[p, k, 16] codes 0..63 -> [p, k/16, 3, 16] int32: per block of 16 k, q4 words of the low
    nibbles of k 0..7 and 8..15 (:func:`_pack_q4_words`' layout), then the high two bits of all 16
    (:func:`_q6_high_shift`). One int32 slice at a time, as the q4 packing: no int64 copy."""
    p, k, _ = codes.shape
    blocks = codes.view(p, k // Q6_BLOCK, Q6_BLOCK, PANEL)
    words = torch.zeros(p, k // Q6_BLOCK, 3, PANEL, dtype=torch.int32)
    for t in range(Q6_BLOCK):
        code = blocks[:, :, t].to(torch.int32)
        w, i = divmod(t, Q4_PER_WORD)
        _or_field(words[:, :, w], code & 15, 4 * i, 4)
        _or_field(words[:, :, 2], code >> 4, _q6_high_shift(t), 2)
    return words


def _unpack_q6(words: torch.Tensor) -> torch.Tensor:
    """:func:`_pack_q6` undone: [p, k/16, 3, 16] int32 -> [p, k, 16] uint8 codes."""
    p, nb = words.shape[:2]
    low = _unpack_q4_words(words[:, :, :2].reshape(p, nb * 2, PANEL)).view(p, nb, Q6_BLOCK, PANEL)
    shifts = torch.tensor([_q6_high_shift(t) for t in range(Q6_BLOCK)], dtype=torch.int64).view(1, 1, Q6_BLOCK, 1)
    high = (words[:, :, 2:3].to(torch.int64) >> shifts) & 3
    return (low | (high << 4).to(torch.uint8)).view(p, nb * Q6_BLOCK, PANEL)


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
    codes: torch.Tensor  # [n_pad/16, k, 16] (q4: [n_pad/16, k/8, 16] int32, eight k per word; q6:
    # [n_pad/16, k/16, 3, 16] int32, _pack_q6's blocks)
    scales: torch.Tensor | None  # [n_pad/16, k/group, 16] float32
    offsets: torch.Tensor | None
    # Compact copies of the scales and offsets, which both products read (the same floats once
    # rebuilt, fewer bytes a step), stored as scale_form says (scales.h): 1 (SCALES_F16): fp16
    # copies [n_pad/16, k/group, 16], where every value is exactly an fp16 (the GGUF kinds with
    # fp16 scales: a third fewer bytes for Q4_1 layers); SCALES_FACTORED + s: a K-quant's factored
    # form, per panel a row of bytes (per super-block of 2**s groups an fp16 factor row, then int8
    # sub-scale rows), where it rebuilds every fp32 value bit for bit (Q4_K: 4.6 bits a weight
    # instead of 6; Q6_K: 8.6 instead of 10). 0 (None, None): the products read the fp32 ones,
    # which are kept in every case for to_rows (the row form has no panel layout to rebuild from).
    compact_scales: torch.Tensor | None = None
    compact_offsets: torch.Tensor | None = None
    scale_form: int = 0

    @property
    def kind_id(self) -> int:
        return KIND_IDS[self.kind]

    @classmethod
    def from_rows(cls, rows: QuantRows) -> StoredPanels:
        n, k = rows.shape
        step = {"q4": Q4_PER_WORD, "q6": Q6_BLOCK}.get(rows.kind, 2)
        if rows.kind in QUANT_KINDS and (rows.group <= 0 or k % rows.group or rows.group % step):
            raise ValueError(f"group {rows.group} does not divide k={k} evenly (nor is a multiple of {step})")
        if rows.kind == "q6" and rows.codes.numel() and int(rows.codes.max()) > 63:
            raise ValueError("q6 codes are 0..63")
        n_pad = -(-n // PANEL) * PANEL
        codes = _to_panels(rows.codes, n_pad)
        if rows.kind == "q4":
            codes = _pack_q4_words(codes)
        elif rows.kind == "q6":
            codes = _pack_q6(codes)
        scales = _to_panels(rows.scales, n_pad) if rows.scales is not None else None
        offsets = _to_panels(rows.offsets, n_pad) if rows.offsets is not None else None
        compact = _factored_copies(rows, n_pad) or _half_copies(rows.kind, scales, offsets)
        return cls(rows.kind, rows.group, n, k, codes, scales, offsets, *compact)

    def to_rows(self) -> QuantRows:
        codes = self.codes
        if self.kind == "q4":
            codes = _unpack_q4_words(codes)
        elif self.kind == "q6":
            codes = _unpack_q6(codes)
        unpack = (lambda t: None if t is None else _from_panels(t, self.n))  # noqa: E731
        return QuantRows(self.kind, self.group, _from_panels(codes, self.n), unpack(self.scales), unpack(self.offsets))

    def dequantize(self) -> torch.Tensor:
        return self.to_rows().dequantize()

    @property
    def nbytes(self) -> int:
        """Bytes one product reads, in either precision: the codes, and the compact copies of the
        scales and offsets where there are some, else the fp32 ones."""
        if self.scale_form and self.compact_scales is not None:
            return _nbytes(self.codes, self.compact_scales, self.compact_offsets)
        return _nbytes(self.codes, self.scales, self.offsets)


_ScaleCopies = tuple[torch.Tensor | None, torch.Tensor | None, int]


def _half_copies(kind: str, scales: torch.Tensor | None, offsets: torch.Tensor | None) -> _ScaleCopies:
    """fp16 copies of a quant kind's panel scales and offsets, both or neither (then form 0)."""
    scales16 = _exact_half(scales) if kind in QUANT_KINDS else None
    offsets16 = _exact_half(offsets)
    if scales16 is None or (offsets is not None and offsets16 is None):
        return None, None, 0
    return scales16, offsets16, SCALES_F16


def _factored_copies(rows: QuantRows, n_pad: int) -> _ScaleCopies | None:
    """The factored copies (scales.h) of a K-quant's scales and offsets, both or None: None also
    where the rows carry no factoring or it does not rebuild every fp32 value bit for bit, so the
    answers never rest on what the reader assumed of the file."""
    if rows.kind not in QUANT_KINDS or rows.scales is None or rows.scale_base is None or rows.scale_sub is None:
        return None
    pairs = [(rows.scales, rows.scale_base, rows.scale_sub)]
    if rows.offsets is not None:
        if rows.offset_base is None or rows.offset_sub is None:
            return None
        pairs.append((rows.offsets, rows.offset_base, rows.offset_sub))
    groups, supers = rows.scales.shape[1], rows.scale_base.shape[1]
    per = groups // supers if supers and groups % supers == 0 else 0
    if not 0 < per <= 256 or per & (per - 1):  # super-blocks of 2**s groups, s <= 8 (fast.c's bound)
        return None
    packed = [_factored_panels(full, base, sub, per, n_pad) for full, base, sub in pairs]
    if any(p is None for p in packed):
        return None
    return packed[0], packed[1] if len(packed) > 1 else None, SCALES_FACTORED + per.bit_length() - 1


def _factored_panels(full: torch.Tensor, base: torch.Tensor, sub: torch.Tensor, per: int,
                     n_pad: int) -> torch.Tensor | None:
    """[n_pad/16, bytes] uint8: per panel and super-block the fp16 base row, then the int8 sub
    rows; None unless base is fp16-exact and base * sub is ``full``, every bit."""
    n, groups = full.shape
    if base.shape != (n, groups // per) or sub.shape != full.shape or sub.dtype != torch.int8:
        return None
    half = _exact_half(base.float())
    if half is None:
        return None
    rebuilt = half.float().repeat_interleave(per, dim=1) * sub.float()
    if not torch.equal(rebuilt.view(torch.int32), full.float().contiguous().view(torch.int32)):
        return None
    factors = _to_panels(half, n_pad).view(torch.uint8)  # [p, supers, 32]
    subs = _to_panels(sub, n_pad).view(torch.uint8).reshape(n_pad // PANEL, groups // per, per * PANEL)
    return torch.cat([factors, subs], dim=2).reshape(n_pad // PANEL, -1)


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
