"""Read a GGUF's tensors as stored (quant blocks kept), named like a Hugging Face state dict.

Why: the fp32 conversion (gguf_convert) turns a 98 MB Q4_1 file into 538 MB of fp32 that every
token then streams. Here each 2-D weight becomes a :class:`QuantRows` (integer codes + one fp32
scale/offset per block), no fp32 copy is made, and the kernels decode blocks in registers.

Each format's unpacking is written from the GGML block layouts; the per-block scale and offset
are computed in float32 exactly as gguf-py's reference ``dequantize`` computes them, so that
``QuantRows.dequantize()`` equals the reference bit for bit (the tests check every format).
Q4_K and Q6_K also hand over their scales as the file factors them (an fp16 ``d`` per 256 k times
a small integer per group), which the kernels read instead of the fp32 products: fewer bytes a
step for the same floats (weights.py checks the factoring before it relies on it).
Q6_K keeps its 6-bit codes (kind q6: 6 bits a weight, where 8-bit codes streamed a third more
bytes for the same values). Q5_0 (which Q4_K_M files use where a row is no multiple of 256) is
kept as 8-bit codes. Formats
without a stored kernel (Q5_1, Q5_K, Q2_K, IQ*, ...) are dequantized to fp32 with gguf-py:
they work, without the memory saving.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.kernels.weights import QuantRows
from engine.models.gguf_convert import (
    GGUFConversionError,
    gguf_family,
    hf_config,
    hf_names,
    to_hf_values,
)
from engine.models.gguf_file import GGUFFormatError, read_gguf

K_SUPER = 256  # k values of a K-quant super-block (one d, one dmin)
STORED_FORMATS = ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K")


def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian f16 bytes [..., 2] -> float32 [..., 1] (exact)."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _rows(codes: np.ndarray, n: int, k: int, scales: np.ndarray | None = None,
          offsets: np.ndarray | None = None, *, kind: str, group: int,
          factored: tuple[np.ndarray, ...] = ()) -> QuantRows:
    """factored: a K-quant's (scale base, scale sub[, offset base, offset sub]) per super-block of
    256 k and per group, as QuantRows documents them."""
    def t(a: np.ndarray | None, cols: int) -> torch.Tensor | None:
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a).reshape(n, cols))
    cols = [k // K_SUPER, k // group] * 2
    return QuantRows(kind, group, t(codes, k), t(scales, k // max(group, 1)), t(offsets, k // max(group, 1)),
                     *(t(a, c) for a, c in zip(factored, cols, strict=False)))


def quant_rows(data: np.ndarray, qtype: str, n: int, k: int) -> QuantRows:
    """One GGUF tensor (``reader.tensors[i].data``, GGML type name ``qtype``) of shape [n, k]."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)  # typed arrays from gguf-py too
    if qtype == "F32":
        return QuantRows("f32", 0, torch.from_numpy(raw.view(np.float32).reshape(n, k).copy()))
    if qtype in ("F16", "BF16"):
        return QuantRows(qtype.lower(), 0, torch.from_numpy(raw.view(np.int16).reshape(n, k).copy()))
    if qtype == "Q8_0":
        b = raw.reshape(-1, 34)
        return _rows(b[:, 2:].view(np.int8), n, k, _f16(b[:, :2]), kind="q8", group=32)
    if qtype == "Q5_0":  # 5-bit codes, kept as 8-bit ones: d * (q - 16), exact like d * int8
        b = raw.reshape(-1, 22)
        high = (b[:, 2:6].copy().view("<u4") >> np.arange(32, dtype=np.uint32)) & 1  # bit j: element j
        qs = b[:, 6:]
        low = np.concatenate([qs & 15, qs >> 4], axis=1)  # element j < 16: low nibble j; else high
        codes = (low | (high.astype(np.uint8) << 4)).astype(np.int8) - np.int8(16)
        return _rows(codes, n, k, _f16(b[:, :2]), kind="q8", group=32)
    if qtype in ("Q4_0", "Q4_1"):
        b = raw.reshape(-1, 18 if qtype == "Q4_0" else 20)
        qs = b[:, -16:]
        codes = np.concatenate([qs & 15, qs >> 4], axis=1)  # element j < 16: low nibble j; else high
        d = _f16(b[:, :2])
        offset = np.float32(-8) * d if qtype == "Q4_0" else _f16(b[:, 2:4])
        return _rows(codes, n, k, d, offset, kind="q4", group=32)
    if qtype == "Q4_K":
        b = raw.reshape(-1, 144)
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        s = b[:, 4:16]
        lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]  # 8 six-bit scales and mins per super-block
        sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=1).astype(np.float32)
        mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1).astype(np.float32)
        qs = b[:, 16:].reshape(-1, 4, 1, 32)  # 4 chunks of 32 bytes: low nibbles, then high
        codes = np.concatenate([qs & 15, qs >> 4], axis=2).reshape(-1, 256)
        # -(dmin * m) == (-dmin) * m bit for bit (signs are exact), zeros' signs included
        factored = (d, sc.astype(np.int8), -dmin, mn.astype(np.int8))
        return _rows(codes, n, k, d * sc, -(dmin * mn), kind="q4", group=32, factored=factored)
    if qtype == "Q6_K":
        b = raw.reshape(-1, 210)
        ql = b[:, :128].reshape(-1, 2, 1, 64)
        qh = b[:, 128:192].reshape(-1, 2, 1, 32)
        low = np.concatenate([ql & 15, ql >> 4], axis=2).reshape(-1, 2, 4, 32)
        high = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=2)  # [-1, 2, 4, 32]
        codes = (low | (high << 4)).reshape(-1, 256)  # the file's q, 0..63: kind q6, d * sc * (q - 32)
        d, sc = _f16(b[:, 208:210]), b[:, 192:208].view(np.int8)
        return _rows(codes, n, k, d * sc.astype(np.float32), kind="q6", group=16, factored=(d, sc))
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        dense = dequantize(raw, GGMLQuantizationType[qtype])
    except NotImplementedError as e:
        raise GGUFConversionError(f"cannot read a {qtype} tensor ({e})") from e
    return QuantRows("f32", 0, torch.from_numpy(np.array(dense, dtype=np.float32).reshape(n, k)))


def gguf_state_header(path: Path) -> dict[str, torch.Tensor]:
    """What :func:`load_gguf_state` names, as ``meta`` tensors of the HF shapes (nothing decoded): what
    a draft's check before the target loads reads (engine/drafters/draft_loader.py), without the fp32
    conversion that reading a GGUF's weights once meant."""
    try:
        gguf = read_gguf(Path(path))
        names = hf_names([t.name for t in gguf.tensors], gguf_family(gguf.metadata))
    except GGUFFormatError as e:
        raise GGUFConversionError(str(e)) from e
    except GGUFConversionError as e:
        raise GGUFConversionError(f"{Path(path).name}: {e}") from e
    return {names[t.name]: torch.empty(tuple(reversed(t.shape)), device="meta") for t in gguf.tensors}


def load_gguf_state(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config dict, state dict) of a GGUF of a family we run (``general.architecture``): 2-D
    weights as QuantRows, 1-D ones as fp32 tensors, values as the HF checkpoint holds them."""
    try:
        gguf = read_gguf(Path(path))
        family = gguf_family(gguf.metadata)  # before any tensor is read
        names = hf_names([t.name for t in gguf.tensors], family)
    except GGUFFormatError as e:
        raise GGUFConversionError(str(e)) from e
    except GGUFConversionError as e:
        raise GGUFConversionError(f"{Path(path).name}: {e}") from e
    shapes = {names[t.name]: tuple(reversed(t.shape)) for t in gguf.tensors}
    config = hf_config(gguf.metadata, shapes)
    state: dict[str, Any] = {}
    for t in gguf.tensors:
        shape = shapes[names[t.name]]
        if len(shape) == 1:
            vector = quant_rows(t.data, t.type_name, 1, shape[0]).dequantize().reshape(-1).clone()
            state[names[t.name]] = torch.from_numpy(to_hf_values(vector.numpy(), t.name, family, config))
            continue
        state[names[t.name]] = to_hf_values(quant_rows(t.data, t.type_name, *shape), t.name, family, config)
    return config, state
