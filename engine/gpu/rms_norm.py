"""RMSNorm for CUDA bf16/fp16 with one program per row: a row's bits never depend on the row count.

Why not ``F.rms_norm`` there: torch promises nothing about a row's bits across row counts. By
version it is a composite (the mean of squares through ATen's generic reduction, whose launch
shape torch picks from the tensor's shape: ``setReduceConfig`` gives each row fewer threads as
rows are added) or a fused kernel; either may add a row's squares in another order in a 64-row
verify than in a one-row decode, and we do not depend on which torch the GPU box has. Here each
row is one program that loads the whole row (``BLOCK`` = the next power of two of its width, fixed
per model) and sums it with one ``tl.sum``, the same tree of additions whatever the number of rows.
Rotary is elementwise (engine/models/rope.py), so already per row.

The arithmetic follows torch's composite ``rms_norm`` for a 16-bit input: the row is widened to
fp32, ``x * rsqrt(mean(x^2) + eps)`` is rounded to the input's dtype, then multiplied by the
weight in fp32 and rounded again, so the two paths differ only by the order of the sum.

``SPECCHAT_CUDA_LINEAR=cublas`` (engine/gpu/linear.py) turns this off with the linears: the switch
is the whole invariant path against torch's stock kernels.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine import gpu
from engine.gpu.linear import DTYPES, active_name


def _build() -> Any:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["stride_x", "stride_y"])
    def rms_norm_kernel(X, W, Y, stride_x, stride_y, H, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        ok = cols < H
        x = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
        mean_sq = tl.sum(x * x, axis=0) / H
        normed = (x * tl.math.rsqrt(mean_sq + eps)).to(Y.dtype.element_ty).to(tl.float32)
        w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(Y + row * stride_y + cols, (normed * w).to(Y.dtype.element_ty), mask=ok)

    return rms_norm_kernel


def invariant_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over x's last dimension with the Triton kernel; x: [..., H] bf16/fp16, weight: [H]."""
    import triton

    h = x.shape[-1]
    rows = x.reshape(-1, h)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(h)
        gpu.kernel("rms_norm", _build)[(rows.shape[0],)](
            rows, weight, out, rows.stride(0), out.stride(0), h, eps,
            BLOCK=block, num_warps=4 if block <= 2048 else 8, num_stages=1,
        )
    return out.reshape(x.shape)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over x's last dimension: the per-row Triton kernel for CUDA bf16/fp16 on the invariant
    path, ``F.rms_norm`` everywhere else (CPU, fp32, ``SPECCHAT_CUDA_LINEAR=cublas``, no triton)."""
    if x.is_cuda and x.dtype in DTYPES and weight.dtype == x.dtype and active_name() == "invariant" \
            and gpu.triton_available():
        return invariant_rms_norm(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)
