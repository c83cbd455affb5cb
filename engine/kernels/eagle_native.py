"""An EAGLE head's forward in one native call (``eagle_native.c``): a whole draft level, or the catch-up.

Why: a draft level of the embedded model's head is ~9 M multiply-adds per node, a small fraction
of a target step, but as ~20 torch operations with Python between them it cost as much as a
sixth of a step. :class:`NativeHead` describes the head's weights to C once (the same structs as
the native decoder) and runs a level as one call. The kernels and their order are the per-op
path's, so the outputs do not change (tests/test_eagle_native.py).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from engine.kernels.decoder import FastSwitch, _describe, _Dims, _Lin
from engine.kernels.linear import Linear
from engine.kernels.native import ptr, split_rows
from engine.kernels.stored import StoredLinear

if TYPE_CHECKING:
    from engine.kernels.native import NativeKernel
    from engine.models.llama_config import DecoderShape

_p = ctypes.c_void_p


class _Head(ctypes.Structure):
    _fields_ = [("ln_in", _p), ("ln_hidden", _p), ("ln_post", _p), ("norm", _p), ("fc", _Lin), ("qkv", _Lin),
                ("o", _Lin), ("gate_up", _Lin), ("down", _Lin), ("lm_head", _Lin), ("eagle3", ctypes.c_long)]


@dataclass(frozen=True)
class Keys:
    """Which head-cache slots each entry attends to: slots 0..prefix[t]-1 (the committed entries),
    then the slots extra[t] lists (its ancestors' scratch entries and its own).

    Kept as lists: the native kernel reads them as C arrays (:meth:`arrays`), and only the per-op
    path builds the [T, keys] mask (:meth:`mask`). Why not tensors: a draft level built four, and
    each torch operation costs ~5-20 us with the caches cold after the target's forward."""

    prefix: list[int]
    extra: list[list[int]]

    @classmethod
    def build(cls, prefix: list[int], extra: list[list[int]]) -> Keys:
        """Slots 0..prefix[t]-1 (the committed entries), then the listed ones."""
        return cls(prefix, extra)

    @classmethod
    def causal(cls, start: int, T: int) -> Keys:
        """T new entries at slots start.. after ``start`` committed ones, each seeing those and itself."""
        return cls([start + t + 1 for t in range(T)], [[] for _ in range(T)])

    def mask(self, keys: int) -> torch.Tensor:
        """The same visibility as a [T, keys] bool mask (the torch path's form), in a few tensor ops
        whatever T is (a loop over rows cost four ops and a scalar read per row of every level)."""
        T, width = len(self.prefix), max(1, max((len(e) for e in self.extra), default=0))
        slot = torch.arange(keys)[None, :]
        m = slot < torch.tensor(self.prefix, dtype=torch.int64)[:, None]
        # unused list entries point at a spare column, dropped after the scatter
        cols = torch.tensor([[*e, *[keys] * (width - len(e))] for e in self.extra], dtype=torch.int64).view(T, width)
        extra = torch.zeros(T, keys + 1, dtype=torch.bool).scatter_(1, cols, True)
        return m | extra[:, :keys]

    def arrays(self) -> tuple[Any, Any, Any, int, Any]:
        """(first, last, extra, width, count) as C arrays for eagle_native.c: entry t sees first[t]..last[t],
        then extra[t * width..][:count[t]]."""
        T = len(self.prefix)
        width = max(1, max((len(e) for e in self.extra), default=0))
        padded = [v for e in self.extra for v in (*e, *[0] * (width - len(e)))]
        return ((ctypes.c_long * T)(), (ctypes.c_long * T)(*[p - 1 for p in self.prefix]),
                (ctypes.c_int * (T * width))(*padded), width, (ctypes.c_int * T)(*[len(e) for e in self.extra]))


def _longs(values: torch.Tensor | Sequence[int] | None) -> Any:
    """int64 values for a C ``const long *``: a tensor as contiguous int64, a list as a C array."""
    if values is None:
        return None
    if isinstance(values, torch.Tensor):
        return values.to(torch.int64).contiguous()
    return (ctypes.c_long * len(values))(*values)


def _address(values: Any) -> int | None:
    if values is None:
        return None
    return values.data_ptr() if isinstance(values, torch.Tensor) else ctypes.addressof(values)


class NativeHead(FastSwitch):
    """One EAGLE head bound to the native library; built by :meth:`for_head` (None: not possible)."""

    def __init__(self, kernel: NativeKernel, head: _Head, dims: _Dims, keep: list[torch.Tensor], vocab: int) -> None:
        self._fn = kernel.eagle_head_forward
        self._head = head
        self._dims = dims
        self._keep = keep
        self.vocab = vocab

    @classmethod
    def bind(cls, kernel: NativeKernel, shape: DecoderShape, linears: Sequence[Linear | StoredLinear],
             norms: Sequence[torch.Tensor | None], *, eagle3: bool) -> NativeHead | None:
        """A head's layers in eagle_native.c's order: ``linears`` fc, qkv, o, gate_up, down, lm_head (the
        target's for EAGLE-1/2); ``norms`` ln_in, ln_hidden, ln_post, norm (EAGLE-3's; None where the
        kind has none). None when some layer or width does not suit the kernel."""
        _fc, _qkv, _o, gate_up, _down, lm_head = linears
        intermediate = gate_up.out_features // 2
        lins = [_describe(lin) for lin in linears]
        if any(lin is None for lin in lins) or shape.hidden_size % 8 or shape.head_dim % 8 or intermediate % 8:
            return None
        ln_in, ln_hidden, ln_post, norm = norms
        if eagle3 and (ln_in is None or ln_hidden is None or norm is None):
            return None
        floats = [None if t is None else t.float().contiguous() for t in (ln_in, ln_hidden, ln_post,
                                                                          norm if eagle3 else None)]
        struct = _Head(*(ptr(t) for t in floats), *lins, int(eagle3))
        keep = [t for t in floats if t is not None]
        return cls(kernel, struct, _Dims.of(shape, intermediate), keep, lm_head.out_features)

    def forward(self, emb: torch.Tensor, stream: torch.Tensor, table: torch.Tensor,
                positions: torch.Tensor | Sequence[int] | None, k: torch.Tensor, v: torch.Tensor, start: int,
                keys: Keys | None, logits: int, picks: int = 0, vocab: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None, tuple[list[list[int]], list[list[float]]] | None]:
        """emb [T, H], stream [T, F] fp32 contiguous; table: the rotary factors by position [L, hd/2]
        complex64, contiguous; positions: each entry's (int64 tensor or list, each < L, or ValueError;
        None: its slot); k, v: the head cache's one layer [nkv, cap, hd]; the entries go to slots
        start, start + 1, ...; ``keys`` None: entry t sees slots 0..its own (a catch-up of committed
        entries, built in the kernel). Returns (g [T, H], the log-probabilities of the last ``logits``
        entries [logits, vocab] or None for 0, and with ``picks`` > 0 each of those rows' ``picks``
        best as (ids, log-probabilities) lists, the ids mapped through ``vocab`` (int64 [vocab]: target
        ids) where given)."""
        T, H = emb.shape
        g = torch.empty(T, H, dtype=torch.float32)
        out = torch.empty(logits, self.vocab, dtype=torch.float32) if logits else None
        n = logits * picks if logits else 0
        top_ids, top_vals = (ctypes.c_long * n)(), (ctypes.c_float * n)()  # plain lists back, no torch op
        self._dims.nthreads = torch.get_num_threads()
        pos = _longs(positions)
        listed = keys.arrays() if keys is not None else None  # held until the call returns
        rc = self._fn(ctypes.addressof(self._head), ctypes.addressof(self._dims), emb.data_ptr(), stream.data_ptr(),
                      stream.shape[1], T, k.data_ptr(), v.data_ptr(), k.shape[1], None, start,
                      table.data_ptr(), table.shape[0], _address(pos),
                      *((None, None, None, 0, None) if listed is None else
                        (ctypes.addressof(listed[0]), ctypes.addressof(listed[1]), ctypes.addressof(listed[2]),
                         listed[3], ctypes.addressof(listed[4]))), g.data_ptr(), logits, ptr(out), picks if n else 0,
                      ptr(vocab), top_ids, top_vals)
        if rc == -2:
            raise ValueError(f"a draft position outside the rotary table of {table.shape[0]} positions")
        if rc != 0:
            raise MemoryError("the native EAGLE head could not allocate its scratch buffers")
        if not n:
            return g, out, None
        return g, out, (split_rows(top_ids, logits, picks), split_rows(top_vals, logits, picks))
