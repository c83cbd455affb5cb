"""A small, fast GGUF reader: metadata scalars and memory-mapped tensor bytes.

Why not ``gguf.GGUFReader``: it builds numpy views for every element of the vocabulary arrays
(~150k strings for a 49k-token vocabulary), which takes 5-15 s on a small CPU, on every start.
Loading weights needs only the scalar metadata and where each tensor's bytes are; big arrays are
skipped (their lengths are read, their contents are not decoded).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import UserError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY, _FLOAT32 = 8, 9, 6
_SMALL_ARRAY = 64  # arrays up to this many entries are decoded; longer ones are skipped


class GGUFFormatError(UserError, ValueError):
    """Not a GGUF file, or a damaged one; the message names the file and says so in one line."""


_MAX_DIMS = 8  # GGML tensors have at most 4 dimensions


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

    def left(self) -> int:
        return len(self.buf) - self.pos

    def count(self, fmt: str, least: int, what: str) -> int:
        """A count read from the header, bounded by the bytes left (each item takes ``least`` or
        more): a damaged or hostile header claiming 2^40 entries is refused, not looped over."""
        n = self.unpack(fmt)
        if n * least > self.left():
            raise GGUFFormatError(f"the header claims {n} {what} but only {self.left()} bytes follow")
        return n

    def string(self) -> str:
        n = self.count("<Q", 1, "bytes of text")
        s = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_string(self) -> None:
        n = self.count("<Q", 1, "bytes of text")  # moves past the length first
        self.pos += n

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            sub = self.unpack("<I")
            if sub != _STRING and sub not in _SCALARS:
                raise GGUFFormatError(f"unknown GGUF array type {sub}")
            count = self.count("<Q", 8 if sub == _STRING else struct.calcsize(_SCALARS[sub]), "array entries")
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
        if version not in (2, 3):  # a newer layout would be misread field by field (issue 50)
            raise GGUFFormatError(f"{path}: GGUF version {version} is not supported (versions 2-3 are)")
        n_tensors = cur.count("<Q", 24, "tensors")  # name length, dims, type, offset: 24 bytes or more
        n_kv = cur.count("<Q", 12, "metadata entries")  # key length, value type: 12 bytes or more
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            meta[key] = cur.value(cur.unpack("<I"))
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.unpack("<I")
            if n_dims > _MAX_DIMS:
                raise GGUFFormatError(f"tensor {name} claims {n_dims} dimensions")
            dims = tuple(cur.unpack("<Q") for _ in range(n_dims))
            infos.append((name, dims, cur.unpack("<I"), cur.unpack("<Q")))
        align = max(1, int(meta.get("general.alignment") or 32))
        start = -(-cur.pos // align) * align
        tensors = []
        for name, dims, type_id, offset in infos:
            qtype = GGMLQuantizationType(type_id)
            block, size = GGML_QUANT_SIZES[qtype]
            count = math.prod(dims)  # a Python int: numpy's product wraps around on a hostile header
            nbytes = count // block * size
            data = mm[start + offset : start + offset + nbytes]
            if data.size != nbytes:
                raise GGUFFormatError(f"{path} is truncated (tensor {name})")
            tensors.append(GGUFTensor(name, dims, qtype.name, data))
    except GGUFFormatError as e:
        if str(e).startswith(str(path)):
            raise
        raise GGUFFormatError(f"{path} is not a valid GGUF file: {e}") from None
    except (struct.error, UnicodeDecodeError, ValueError, IndexError, OverflowError) as e:
        raise GGUFFormatError(f"{path} is not a valid GGUF file: {e}") from None
    return GGUFFile(meta, tensors)
