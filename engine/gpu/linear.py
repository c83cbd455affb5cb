"""Batch-invariant bf16 linears for CUDA: ``y = x @ W.T (+ b)`` whose bits never depend on the row count.

Why: greedy speculation is lossless only if a token's logits are the same bits whether it is decoded
alone (1 row), verified inside a draft tree (2-64 rows) or read in a prefill. cuBLAS picks its
kernel, tile and split-K per call shape, so a row's reduction order (and, rarely, a near-tied
argmax) changes with the number of rows beside it. Here the whole reduction order is fixed per
weight, never per call:

- one tile shape for every call on a weight: ``BLOCK_M`` rows (masked past M), ``BLOCK_N`` columns
  and ``BLOCK_K`` of the reduction, chosen by :func:`config_for` from (N, K) alone;
- K is walked in ``BLOCK_K`` steps from 0 to K, one ``tl.dot`` per step into an fp32 accumulator,
  in one program per output tile: no split-K, no atomics, no autotune keyed on M;
- ``M`` and the row stride are not specialised (``do_not_specialize``), so M=1 and M=64 run the same
  binary (triton would otherwise compile a ``M == 1`` variant); a prefill chunk of any M is the same
  tiles over more row blocks. Each output element is its own row's dot product with its own
  column, accumulated by the same tensor-core instruction sequence wherever the row sits in a tile,
  and the masked rows are zeros that reach no other row.

Why this config on H100/H200 (sm_90) and A100 (sm_80), measured nowhere yet (no GPU was lent):

- ``BLOCK_M = 64`` for every M: one warpgroup's ``wgmma`` is m64 on Hopper, and one row block holds the
  largest verify bucket, so a tree of 64 reads each weight tile once (verify(64) costs about what
  verify(1) costs in the linears, the issue's <= 1.5 target). A narrower tile for decode would be
  another instruction (``mma.sync``) with no promise of the same bits, so it is not an option here.
  Decode pays 64 rows of tensor-core work per weight byte: 64 flop/B against the H100's ~295
  (dense bf16 over HBM), so the products stay hidden under the weight stream.
- ``BLOCK_K = 64`` (128-byte bf16 rows: full sectors, swizzle-friendly) and 4 stages: 24 KiB of
  shared memory at ``BLOCK_N = 32``, 40 KiB at 64 (sm_90), enough loads in flight to keep each SM's
  share of HBM busy, and room for several programs an SM.
- ``BLOCK_N`` per weight: 64 from 8192 columns (lm_head, gate|up: hundreds of tiles either way), 32
  below, so the 4096-column o/down of an 8B model still make 128 programs for 132 SMs (64 would
  leave half the SMs idle at decode). The weight stream is the cost, and a wider tile reads no
  fewer weight bytes; 128 columns spilled registers on sm_80 (144 bytes a thread at 4 warps).
- ``num_warps = 4``: one warpgroup; the [64, BLOCK_N] fp32 accumulator is 16-32 registers a thread.
  tests/gpu/test_compile_sm90.py compiles these for sm_90 and sm_80 and checks nothing spills and
  that the products are tensor-core instructions (wgmma on sm_90, mma.sync on sm_80).

What a GPU run should measure (the device plan): the 8B-shaped baseline's decode (one row) and its
verify cost curve to 64 rows with this kernel and with cuBLAS (``SPECCHAT_CUDA_LINEAR=cublas``) side
by side; the issue keeps this path the default unless it is over ~10% slower at one row. Also
tests/gpu compiled there (tests/gpu/test_invariant_kernels.py then checks the tensor cores' bits,
which the interpreter cannot), and whether 64 columns for o/down (fewer, longer programs) or 3
stages do better; any change stays one config per weight.

The switch: ``SPECCHAT_CUDA_LINEAR=invariant`` (default) or ``cublas`` (``F.linear``, the not-invariant
path). :func:`active_name` says which; a model's ``kernels`` says what its linears were built as.

Triton's CPU interpreter stores bf16 as raw 16-bit integers and multiplies those in ``tl.dot``, so
under ``TRITON_INTERPRET=1`` the tiles are widened to fp32 before the dot (``UPCAST``); compiled
kernels feed bf16 to the tensor cores. The tile walk, masks and order are the same code either way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from engine import gpu
from engine.errors import UserError

ENV_SWITCH = "SPECCHAT_CUDA_LINEAR"
Name = Literal["invariant", "cublas"]
NAMES: tuple[Name, ...] = ("invariant", "cublas")
DTYPES = (torch.bfloat16, torch.float16)  # what the kernel multiplies (fp32 models keep cuBLAS)
BLOCK_M = 64  # rows per tile, for every M (see the module docstring)
BLOCK_K = 64


class CudaLinearError(UserError):
    """``SPECCHAT_CUDA_LINEAR`` names no linear path."""


def active_name() -> Name:
    """Which linear path CUDA bf16/fp16 models get: "invariant" (this module, the default) or
    "cublas" (``F.linear``), from ``SPECCHAT_CUDA_LINEAR``."""
    value = os.environ.get(ENV_SWITCH, "invariant").strip().lower() or "invariant"
    if value not in NAMES:
        raise CudaLinearError(f"{ENV_SWITCH}={value!r}: use invariant (batch-invariant Triton kernels, "
                              "the default) or cublas (torch's F.linear)")
    return value  # type: ignore[return-value]


def takes(weight: torch.Tensor) -> bool:
    """Whether a layer with this weight runs through the invariant kernel: a CUDA bf16/fp16 matrix,
    triton installed and the switch on "invariant". Decided once, when the layer is built."""
    return weight.is_cuda and weight.dtype in DTYPES and active_name() == "invariant" and gpu.triton_available()


@dataclass(frozen=True)
class TileConfig:
    """One weight's tile shape and pipeline: a function of (N, K) only, never of the rows."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def config_for(n: int, k: int) -> TileConfig:
    """The tile config of an [n, k] weight (the module docstring says why these)."""
    block_n = 64 if n >= 8192 else 32
    return TileConfig(BLOCK_M, block_n, BLOCK_K, num_warps=4, num_stages=4)


def _build() -> Any:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["M", "stride_xm", "stride_ym"])
    def invariant_linear_kernel(
        X, W, B, Y, M, N, K, stride_xm, stride_wn, stride_ym,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
    ):
        # row blocks are the fastest grid axis: a prefill's row blocks of one weight tile run side by
        # side and share it through L2 (for M <= 64 there is one row block)
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        m_ok = rm < M
        n_ok = rn < N
        x_ptr = X + rm[:, None] * stride_xm + rk[None, :]
        w_ptr = W + rn[:, None] * stride_wn + rk[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):  # one K order for every M: 0, BLOCK_K, 2 BLOCK_K, ...
            if EVEN_K:
                a = tl.load(x_ptr, mask=m_ok[:, None], other=0.0)
                b = tl.load(w_ptr, mask=n_ok[:, None], other=0.0)
            else:
                k_ok = (k0 + rk) < K
                a = tl.load(x_ptr, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(w_ptr, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            if UPCAST:  # the interpreter only (see the module docstring)
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, tl.trans(b), acc)
            x_ptr += BLOCK_K
            w_ptr += BLOCK_K
        if HAS_BIAS:
            acc += tl.load(B + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        y_ptr = Y + rm[:, None] * stride_ym + rn[None, :]
        tl.store(y_ptr, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])

    return invariant_linear_kernel


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def invariant_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                     out_dtype: torch.dtype | None = None, config: TileConfig | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` with a row's bits independent of how many rows share the call.

    x: [..., K] in the weight's dtype (bf16 or fp16); weight: [N, K] as stored (rows contiguous);
    bias: [N] or None. fp32 accumulation, one rounding to ``out_dtype`` (default: x's dtype; fp32
    keeps the accumulator). ``config``: the weight's tiles (default :func:`config_for`; pass the
    same one on every call on a weight, which the default does)."""
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight takes {k}")
    if x.dtype != weight.dtype or weight.dtype not in DTYPES:
        raise TypeError(f"invariant_linear multiplies bf16/fp16 by the same dtype, got {x.dtype} x {weight.dtype}")
    lead = x.shape[:-1]
    rows = x.reshape(-1, k)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if weight.stride(-1) != 1:
        raise ValueError("the weight's rows must be contiguous (lay it out once, at load)")
    m = rows.shape[0]
    out = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*lead, n)
    cfg = config or config_for(n, k)
    grid = ((m + cfg.block_m - 1) // cfg.block_m, (n + cfg.block_n - 1) // cfg.block_n)
    gpu.kernel("invariant_linear", _build)[grid](
        rows, weight, bias if bias is not None else weight, out, m, n, k,
        rows.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        HAS_BIAS=bias is not None, EVEN_K=k % cfg.block_k == 0, UPCAST=_interpreting(),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out.reshape(*lead, n)


def cuda_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The CUDA linear the switch names: :func:`invariant_linear` where it :func:`takes` the weight
    (and x is in the weight's dtype), else ``F.linear``."""
    if x.dtype == weight.dtype and takes(weight):
        return invariant_linear(x, weight, bias)
    return F.linear(x, weight, bias)
