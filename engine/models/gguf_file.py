"""A small, fast GGUF reader: metadata scalars and memory-mapped tensor bytes.

Why not ``gguf.GGUFReader``: it builds numpy views for every element of the vocabulary arrays
(~150k strings for a 49k-token vocabulary), which takes 5-15 s on a small CPU, on every start.
Loading weights needs only the scalar metadata and where each tensor's bytes are; big arrays are
skipped (their lengths are read, their contents are not decoded).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY, _FLOAT32 = 8, 9, 6
_SMALL_ARRAY = 64  # arrays up to this many entries are decoded; longer ones are skipped


class GGUFFormatError(ValueError):
    """Not a GGUF file, or a damaged one."""


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGML order: the row length first
    type_name: str  # GGML type, e.g. "Q4_1"
    data: np.ndarray  # the raw bytes, uint8, memory-mapped


@dataclass
class GGUFFile:
    metadata: dict[str, Any]
    tensors: list[GGUFTensor]


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_string(self) -> None:
        self.pos += 8 + struct.unpack_from("<Q", self.buf, self.pos)[0]

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            sub, count = self.unpack("<I"), self.unpack("<Q")
            if count > _SMALL_ARRAY:
                if sub == _STRING:
                    for _ in range(count):
                        self.skip_string()
                else:
                    self.pos += count * struct.calcsize(_SCALARS[sub])
                return None
            return [self.value(sub) for _ in range(count)]
        if kind not in _SCALARS:
            raise GGUFFormatError(f"unknown GGUF value type {kind}")
        value = self.unpack(_SCALARS[kind])
        if kind == _FLOAT32:  # the shortest decimal that rounds to the same float32 (like gguf_convert)
            return float(str(np.float32(value)))
        return value


def read_gguf(path: Path) -> GGUFFile:
    """Metadata (big arrays left out) and memory-mapped tensors of a GGUF file."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise GGUFFormatError(f"{path} cannot be read ({e})") from e
    cur = _Cursor(memoryview(mm))
    try:
        if bytes(mm[:4]) != b"GGUF":
            raise GGUFFormatError(f"{path} is not a GGUF file (bad magic)")
        cur.pos = 4
        version = cur.unpack("<I")
        if version < 2:
            raise GGUFFormatError(f"{path} is GGUF version {version}; only versions 2 and 3 are read")
        n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            meta[key] = cur.value(cur.unpack("<I"))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = tuple(cur.unpack("<Q") for _ in range(cur.unpack("<I")))
            infos.append((name, dims, cur.unpack("<I"), cur.unpack("<Q")))
        align = int(meta.get("general.alignment") or 32)
        start = -(-cur.pos // align) * align
        tensors = []
        for name, dims, type_id, offset in infos:
            qtype = GGMLQuantizationType(type_id)
            block, size = GGML_QUANT_SIZES[qtype]
            count = int(np.prod(dims))
            nbytes = count // block * size
            data = mm[start + offset : start + offset + nbytes]
            if data.size != nbytes:
                raise GGUFFormatError(f"{path} is truncated (tensor {name})")
            tensors.append(GGUFTensor(name, dims, qtype.name, data))
    except (struct.error, UnicodeDecodeError, ValueError, IndexError) as e:
        if isinstance(e, GGUFFormatError):
            raise
        raise GGUFFormatError(f"{path} is not a valid GGUF file ({e})") from e
    return GGUFFile(meta, tensors)
