"""The decoder layers of a CPU forward in one native call (``decoder.c``).

Why: with 4-bit weights the arithmetic of a one-token step on the 135M model is ~10 ms, and the
Python between the kernels (argument checks, ctypes marshalling, ~10 small torch ops per layer)
was another 4-5 ms. :class:`NativeDecoder` describes every layer's weights to the C side once, as
an array of plain structs holding pointers into the model's own tensors, so a forward is one call
per run of layers. It runs the same kernels in the same order as the per-op path, so the logits
do not change (tests/test_decoder_native.py checks both paths bit for bit).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from engine.kernels.linear import Linear
from engine.kernels.native import kv16, ptr
from engine.kernels.stored import StoredLinear

if TYPE_CHECKING:
    from engine.kernels.native import NativeKernel
    from engine.models.kv_cache import KVCache
    from engine.models.layer import LayerWeights
    from engine.models.llama_config import DecoderShape, LlamaConfig

MAX_PARTS = 3  # must match decoder.c
_p, _l, _f = ctypes.c_void_p, ctypes.c_long, ctypes.c_float


class _Part(ctypes.Structure):
    _fields_ = [("kind", _l), ("group", _l), ("n", _l), ("codes", _p), ("scales", _p), ("offsets", _p),
                ("compact_scales", _p), ("compact_offsets", _p), ("scale_form", _l)]


class _Lin(ctypes.Structure):
    _fields_ = [("panels", _p), ("n", _l), ("k", _l), ("nparts", _l), ("bias", _p), ("parts", _Part * MAX_PARTS)]


class _Layer(ctypes.Structure):
    _fields_ = [("ln_attn", _p), ("ln_mlp", _p), ("qkv", _Lin), ("o", _Lin), ("gate_up", _Lin), ("down", _Lin)]


class _Dims(ctypes.Structure):
    _fields_ = [("hidden", _l), ("heads", _l), ("kv_heads", _l), ("head_dim", _l), ("inter", _l),
                ("window", _l), ("nthreads", _l), ("eps", _f), ("scale", _f), ("fast", _l), ("kv16", _l)]

    @classmethod
    def of(cls, shape: DecoderShape, intermediate: int, window: int = 0) -> _Dims:
        """The sizes of a decoder of this shape (a target model's layers, an EAGLE head)."""
        return cls(shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim, intermediate, window, 1,
                   shape.rms_norm_eps, shape.head_dim**-0.5, 0, 0)


def _describe(lin: Linear | StoredLinear) -> _Lin | None:
    """The C view of one linear layer, or None when the native decoder cannot run it."""
    out = _Lin(n=lin.out_features, k=lin.in_features)
    if isinstance(lin, StoredLinear):
        if lin._kernel is None or len(lin.parts) > MAX_PARTS:
            return None
        out.bias = ptr(lin._bias)
        out.nparts = len(lin.parts)
        for i, part in enumerate(lin.parts):
            out.parts[i] = _Part(part.kind_id, part.group, part.n, ptr(part.codes), ptr(part.scales), ptr(part.offsets),
                                 ptr(part.compact_scales), ptr(part.compact_offsets), part.scale_form)
        return out
    if lin._kernel is None or lin._packed is None:
        return None
    out.panels = ptr(lin._packed)
    out.bias = ptr(lin._bias)
    return out


class FastSwitch:
    """The precision flag a native runner passes to C in its ``_Dims`` (``fast``: fast.c products)."""

    _dims: _Dims

    @property
    def fast(self) -> bool:
        return bool(self._dims.fast)

    @fast.setter
    def fast(self, on: bool) -> None:
        self._dims.fast = int(on)


class NativeDecoder(FastSwitch):
    """Runs a model's decoder layers through ``decoder_layers``; built by :meth:`for_layers`."""

    def __init__(self, kernel: NativeKernel, layers: ctypes.Array, dims: _Dims, keep: list[torch.Tensor]) -> None:
        self._fn = kernel.decoder_layers
        self._rows_fn = kernel.decoder_rows
        self._layers = layers
        self._count = len(layers)
        self._dims = dims
        self._keep = keep  # the tensors the structs point into (norm weights, contiguous copies)

    @classmethod
    def for_layers(cls, config: LlamaConfig, layers: Sequence[LayerWeights], kernel: NativeKernel
                   ) -> NativeDecoder | None:
        """None when some layer needs what only the per-op path has (q/k norms, too many parts)."""
        keep: list[torch.Tensor] = []
        structs = []
        for layer in layers:
            if layer.q_norm is not None or layer.k_norm is not None:
                return None
            lins = [_describe(lin) for lin in layer.linears]
            if any(lin is None for lin in lins):
                return None
            norms = [layer.ln_attn.float().contiguous(), layer.ln_mlp.float().contiguous()]
            keep += norms
            structs.append(_Layer(ptr(norms[0]), ptr(norms[1]), *lins))
        dims = _Dims.of(config, config.intermediate_size, config.sliding_window or 0)
        return cls(kernel, (_Layer * len(structs))(*structs), dims, keep)

    def run(self, x: torch.Tensor, cache: KVCache, rot: torch.Tensor, tree: torch.Tensor | None,
            positions: torch.Tensor, capture: Sequence[int] = ()) -> list[torch.Tensor]:
        """Every layer on x: [T, hidden] fp32 contiguous, in place. rot: [T, head_dim/2] complex64
        contiguous; tree: [T, T] bool or None; positions: [T] int64 contiguous. Returns the residual
        stream entering each layer in ``capture`` (index num_layers: the last layer's output), as
        [T, hidden] views of one buffer that holds them side by side."""
        T = x.shape[0]
        self._dims.nthreads = torch.get_num_threads()
        k, v = cache.k, cache.v
        self._dims.kv16 = kv16(k, v)
        at, out = _capture_buffers(capture, T, x.shape[1])
        rc = self._fn(
            ctypes.addressof(self._layers),
            self._count,
            ctypes.addressof(self._dims),
            x.data_ptr(),
            T,
            k.data_ptr(),
            v.data_ptr(),
            k.stride(0),
            cache.capacity,
            cache.length,
            rot.data_ptr(),
            ptr(tree),
            positions.data_ptr(),
            ptr(at),
            len(capture),
            ptr(out),
        )
        if rc != 0:
            raise MemoryError("the native decoder could not allocate its scratch buffers")
        return _views(out, len(capture))

    def run_rows(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rot: torch.Tensor, positions: torch.Tensor,
                 seg: torch.Tensor, slots: torch.Tensor, capture: Sequence[int] = ()) -> list[torch.Tensor]:
        """Every layer on tokens of independent sequences sharing the cache tensors k, v ([layers,
        kv_heads, cap, head_dim]): token t is written at slot ``slots[t]`` and attends to
        ``seg[t]..slots[t]``. seg, slots, positions: [T] int64 contiguous. Returns the captured
        residuals as :meth:`run` does."""
        self._dims.nthreads = torch.get_num_threads()
        self._dims.kv16 = kv16(k, v)
        at, out = _capture_buffers(capture, x.shape[0], x.shape[1])
        rc = self._rows_fn(
            ctypes.addressof(self._layers), self._count, ctypes.addressof(self._dims), x.data_ptr(), x.shape[0],
            k.data_ptr(), v.data_ptr(), k.stride(0), k.shape[2], rot.data_ptr(), positions.data_ptr(), seg.data_ptr(),
            slots.data_ptr(), ptr(at), len(capture), ptr(out),
        )
        if rc != 0:
            raise MemoryError("the native decoder could not allocate its scratch buffers")
        return _views(out, len(capture))


def _capture_buffers(capture: Sequence[int], T: int, hidden: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The layer indices decoder.c copies the residual out at, and the [T, len(capture), hidden]
    buffer it writes them to (None, None: no capture)."""
    if not capture:
        return None, None
    return torch.tensor(capture, dtype=torch.int64), torch.empty(T, len(capture), hidden, dtype=torch.float32)


def _views(out: torch.Tensor | None, n: int) -> list[torch.Tensor]:
    return [out[:, c] for c in range(n)] if out is not None else []
