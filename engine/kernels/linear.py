"""Dense layers laid out once for skinny matrix products: 1 to ~64 rows times a big weight.

Why: decoding multiplies a handful of rows (1 token, or a draft tree of 2-64 nodes) by every
weight matrix, and on a CPU the verify cost of a tree decides whether speculation pays. The
stock fp32 paths handle these shapes badly (MKL's sgemm repacks the weight on every call;
oneDNN jumps from ~50 to ~100 ms between one and two rows on the 135M model). Three layouts, the
first that works here wins (``SPECCHAT_LINEAR=native|blocked|torch`` forces one):

- ``native``: 16-column panels ``[N/16, K, 16]`` and our AVX2 kernel (``skinny.c``), built on
  first use. Layers + LM head of the 135M model, 2 threads, AMD EPYC (AVX2):
  rows 1/8/16/32 take 17/25/35/59 ms, against 22/38/50/75 ms for ``blocked``.
- ``blocked``: 32-column blocks ``[N/32, K, 32]`` and one ``torch.bmm`` over the blocks, which
  keeps each block in cache while all rows use it (no compiler needed).
- ``torch``: ``F.linear``; used off-CPU (cuBLAS on a GPU) and for non-fp32 CPU weights.
- ``invariant``: CUDA bf16/fp16 weights, by default (engine/gpu/linear.py): Triton tiles fixed per
  weight, so a row's bits do not depend on how many rows share the call, as on the CPU kernels
  below; ``SPECCHAT_CUDA_LINEAR=cublas`` keeps ``torch`` there.

The native kernel also gives each row the same bits whatever the number of rows (one FMA
chain per output), so a token verified inside a tree gets exactly the logits plain decoding
would give it; MKL's batched product does not promise that (rarely, a near-tie could flip).
"""

from __future__ import annotations

import os
from typing import Literal

import torch
import torch.nn.functional as F

from engine.gpu import linear as gpu_linear
from engine.kernels import native

Layout = Literal["native", "blocked", "torch", "invariant"]
PANEL = 16  # columns per native panel (fixed by skinny.c)
BLOCK = 32  # columns per bmm block: 32 was best for 1-8 rows


def cpu_layout() -> Layout:
    """The layout fp32 CPU weights get on this machine."""
    forced = os.environ.get(native.ENV_SWITCH, "").lower()
    if forced in ("torch", "blocked"):
        return forced  # type: ignore[return-value]
    return "native" if native.load() is not None else "blocked"


def _pack(weight: torch.Tensor, width: int) -> torch.Tensor:
    n, k = weight.shape
    pad = (-n) % width
    if pad:
        weight = torch.cat([weight, weight.new_zeros(pad, k)])
    return weight.view(-1, width, k).transpose(1, 2).contiguous()


class Linear:
    """``y = x @ W.T + b``; x: [..., in] -> [..., out] in x's dtype."""

    __slots__ = ("_bias", "_kernel", "_packed", "_weight", "in_features", "layout", "out_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self._bias = bias.contiguous() if bias is not None else None
        cpu_fp32 = weight.device.type == "cpu" and weight.dtype == torch.float32
        self.layout: Layout = cpu_layout() if cpu_fp32 else "invariant" if gpu_linear.takes(weight) else "torch"
        self._kernel = native.load() if self.layout == "native" else None
        self._weight: torch.Tensor | None = None
        self._packed: torch.Tensor | None = None
        if self.layout in ("torch", "invariant"):
            self._weight = weight.contiguous()
        else:
            self._packed = _pack(weight, PANEL if self.layout == "native" else BLOCK)

    def add_into(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``residual += x @ W.T + b`` in place for 2-D fp32 tensors (one pass on the native
        kernel; same result as ``residual + self(x)``). Returns residual."""
        if self._kernel is not None and x.dtype == torch.float32 and residual.is_contiguous():
            return self._kernel.linear(x.contiguous(), self._packed, self.out_features, self._bias, residual)
        return residual.add_(self(x))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.layout == "invariant" and x.dtype == self._weight.dtype:
            return gpu_linear.invariant_linear(x, self._weight, self._bias)
        if self.layout in ("torch", "invariant"):
            return F.linear(x, self._weight, self._bias)
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if self._kernel is not None and rows.dtype == torch.float32:
            y = self._kernel.linear(rows.contiguous(), self._packed, self.out_features, self._bias)
            return y.reshape(*lead, self.out_features)
        blocks = self._packed
        m = rows.shape[0]
        out = torch.bmm(rows.expand(blocks.shape[0], m, self.in_features), blocks)  # [N/b, m, b]
        y = out.transpose(0, 1).reshape(m, -1)
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        if self._bias is not None:
            y = y + self._bias
        return y.reshape(*lead, self.out_features)

    @property
    def nbytes(self) -> int:
        """Bytes of weight a call streams."""
        w = self._packed if self._packed is not None else self._weight
        return w.numel() * w.element_size()

    @property
    def dense_weight(self) -> torch.Tensor:
        """The weight as an ordinary [out, in] tensor."""
        if self._packed is None:
            return self._weight
        return self._packed.transpose(1, 2).reshape(-1, self.in_features)[: self.out_features]
