"""An EAGLE head's forward in one native call (``head.c``): a whole draft level, or the catch-up.

Why: a draft level of the embedded model's head is ~9 M multiply-adds per node, a small fraction
of a target step, but as ~20 torch operations with Python between them it cost as much as a
sixth of a step. :class:`NativeHead` describes the head's weights to C once (the same structs as
the native decoder) and runs a level as one call. The kernels and their order are the per-op
path's, so the outputs do not change (tests/test_eagle_native.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.kernels.decoder import FastSwitch, _describe, _Dims, _Lin
from engine.kernels.native import _ptr

if TYPE_CHECKING:
    from engine.drafters.eagle_head import EagleHead
    from engine.kernels.native import NativeKernel

_p = ctypes.c_void_p


class _Head(ctypes.Structure):
    _fields_ = [("ln_in", _p), ("ln_hidden", _p), ("ln_post", _p), ("norm", _p), ("fc", _Lin), ("qkv", _Lin),
                ("o", _Lin), ("gate_up", _Lin), ("down", _Lin), ("lm_head", _Lin), ("eagle3", ctypes.c_long)]


@dataclass
class Keys:
    """Which head-cache slots each entry attends to: first[t]..last[t], then extra[t, :count[t]]."""

    first: torch.Tensor  # [T] int64
    last: torch.Tensor  # [T] int64 (last < first: no range)
    extra: torch.Tensor  # [T, E] int32
    count: torch.Tensor  # [T] int32

    @classmethod
    def build(cls, prefix: list[int], extra: list[list[int]]) -> Keys:
        """Slots 0..prefix[t]-1 (the committed entries), then the listed ones."""
        width = max(1, max((len(e) for e in extra), default=0))
        table = torch.zeros(len(extra), width, dtype=torch.int32)
        for t, e in enumerate(extra):
            table[t, :len(e)] = torch.tensor(e, dtype=torch.int32)
        return cls(torch.zeros(len(prefix), dtype=torch.int64), torch.tensor(prefix, dtype=torch.int64) - 1, table,
                   torch.tensor([len(e) for e in extra], dtype=torch.int32))

    @classmethod
    def causal(cls, start: int, T: int) -> Keys:
        """T new entries at slots start.. after ``start`` committed ones, each seeing those and itself."""
        return cls(torch.zeros(T, dtype=torch.int64), torch.arange(start, start + T),
                   torch.zeros(T, 1, dtype=torch.int32), torch.zeros(T, dtype=torch.int32))

    def mask(self, keys: int) -> torch.Tensor:
        """The same visibility as a [T, keys] bool mask (the torch path's form)."""
        T = self.first.shape[0]
        slot = torch.arange(keys)[None, :]
        m = (slot >= self.first[:, None]) & (slot <= self.last[:, None])
        for t in range(T):
            m[t, self.extra[t, :int(self.count[t])].long()] = True
        return m


class NativeHead(FastSwitch):
    """One EAGLE head bound to the native library; built by :meth:`for_head` (None: not possible)."""

    def __init__(self, kernel: NativeKernel, head: _Head, dims: _Dims, keep: list[torch.Tensor], vocab: int) -> None:
        self._fn = kernel.eagle_head_forward
        self._head = head
        self._dims = dims
        self._keep = keep
        self.vocab = vocab

    @classmethod
    def for_head(cls, head: EagleHead, kernel: NativeKernel) -> NativeHead | None:
        s = head.spec
        if head.dtype != torch.float32 or head.device.type != "cpu" or head.fc_norms:
            return None
        lm_head = head.lm_head if head.lm_head is not None else head.target.lm_head
        lins = [_describe(lin) for lin in (head.fc, head.qkv, head.o, head.gate_up, head.down, lm_head)]
        if any(lin is None for lin in lins) or s.hidden_size % 8 or s.head_dim % 8 or head.intermediate % 8:
            return None
        eagle3 = s.kind == "eagle3"
        if eagle3 and (head.ln_in is None or head.ln_hidden is None or head.norm is None):
            return None
        norms = [None if t is None else t.float().contiguous() for t in (head.ln_in, head.ln_hidden, head.ln_post,
                                                                            head.norm if eagle3 else None)]
        keep = [t for t in norms if t is not None]
        struct = _Head(*(_ptr(t) for t in norms), *lins, int(eagle3))
        dims = _Dims(s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim, head.intermediate, 0, 1,
                     s.rms_norm_eps, head.scale, 0)
        return cls(kernel, struct, dims, keep, lm_head.out_features)

    def forward(self, emb: torch.Tensor, stream: torch.Tensor, rot: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                slots: torch.Tensor, keys: Keys, logits: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """emb [T, H], stream [T, F] fp32 contiguous; rot [T, hd/2] complex64; k, v: the head cache's
        one layer [nkv, cap, hd]; slots [T] int64. Returns (g [T, H], the logits of the last
        ``logits`` entries [logits, vocab], or None for 0)."""
        T, H = emb.shape
        g = torch.empty(T, H, dtype=torch.float32)
        out = torch.empty(logits, self.vocab, dtype=torch.float32) if logits else None
        self._dims.nthreads = torch.get_num_threads()
        rc = self._fn(ctypes.addressof(self._head), ctypes.addressof(self._dims), emb.data_ptr(), stream.data_ptr(),
                      stream.shape[1], T, k.data_ptr(), v.data_ptr(), k.shape[1], slots.data_ptr(),
                      rot.data_ptr(), keys.first.data_ptr(), keys.last.data_ptr(), keys.extra.data_ptr(),
                      keys.extra.shape[1],
                      keys.count.data_ptr(), g.data_ptr(), logits, _ptr(out))
        if rc != 0:
            raise MemoryError("the native EAGLE head could not allocate its scratch buffers")
        return g, out
