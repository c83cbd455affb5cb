"""Is a bf16 linear batch-invariant on this GPU, and what does an invariant one cost?

Session 25's H200 run found greedy speculation in bf16 identical to the bf16 baseline on only
10/12 (n-gram) and 2/12 (EAGLE-3) MT-bench prompts: the attention kernel is batch-invariant by
construction (engine/gpu/tree_attention.py), the linears go to cuBLAS, which may pick another
kernel (tile, split-K) for 1 row than for 8. This probe answers, in one short call, what the
static path's linears would need:

1. cuBLAS (``x[:M] @ w.T``, bf16): does row r of an M-row product equal row r of the one-row
   product, bit for bit, for M in the verify buckets? (Counts of differing elements.)
2. A candidate Triton kernel whose tile shape, K order and split count never depend on M (so
   each row is computed by the same instructions whatever M): the same check, its error against
   an fp32 product, and its time against cuBLAS's at 1, 8 and 64 rows (median, CUDA events),
   with the one-row bandwidth.

    python3 scripts/device/bi_probe.py                       # on the GPU (lease15.sh a runs it)
    TRITON_INTERPRET=1 python3 scripts/device/bi_probe.py --dry   # here: tiny fp32 shapes on CPU
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64


@triton.jit
def _partial(x_ptr, w_ptr, out_ptr, M, N, K, k_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr):
    """out[s, m, n] = sum over split s's K range of x[m, k] * w[n, k], fp32, K in BLOCK_K steps."""
    pm, pn, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k0 = s * k_per_split
    for kb in range(0, k_per_split, BLOCK_K):
        rk = k0 + kb + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc = tl.dot(x, w, acc)
    tl.store(out_ptr + s * M * N + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def invariant_linear(x: torch.Tensor, w: torch.Tensor, splits: int) -> torch.Tensor:
    """x [M, K] @ w[N, K].T with a fixed tile and a fixed split of K, reduced in split order."""
    M, K = x.shape
    N = w.shape[0]
    k_per_split = triton.cdiv(triton.cdiv(K, splits), BLOCK_K) * BLOCK_K
    parts = torch.empty(splits, M, N, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N), splits)
    _partial[grid](x, w, parts, M, N, K, k_per_split, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    out = parts[0]
    for s in range(1, splits):  # elementwise adds in a fixed order: the same for every row and every M
        out = out + parts[s]
    return out.to(x.dtype)


def differing(fn, x: torch.Tensor, w: torch.Tensor) -> dict[int, int]:
    """Elements of rows 0..M-1 of an M-row call that differ from the same rows of the 64-row call."""
    full = fn(x, w)
    return {m: int((fn(x[:m].contiguous(), w) != full[:m]).sum()) for m in BUCKETS}


def timed(fn, *args) -> float:
    return triton.testing.do_bench(lambda: fn(*args), warmup=25, rep=100, return_mode="median")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry", action="store_true", help="tiny fp32 shapes on the CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    device = "cpu" if args.dry else "cuda"
    dtype = torch.float32 if args.dry else torch.bfloat16
    shapes = [(576, 96)] if args.dry else [(576, 1536), (4096, 4096), (4096, 14336), (14336, 4096)]
    gen = torch.Generator(device=device).manual_seed(0)
    print(f"{torch.cuda.get_device_name() if not args.dry else 'cpu (interpreter)'}, {dtype}")
    for K, N in shapes:
        x = torch.randn(64, K, generator=gen, device=device).to(dtype)
        w = (torch.randn(N, K, generator=gen, device=device) / K**0.5).to(dtype)
        ref = x.double() @ w.double().T
        splits = 1 if N >= 8192 else 4  # enough programs for the SMs at one row, fixed per shape
        inv = lambda a, b, s=splits: invariant_linear(a, b, s)  # noqa: E731
        err = float((inv(x, w).double() - ref).norm() / ref.norm())
        print(f"K={K} N={N}: cuBLAS differing elements by M {differing(lambda a, b: a @ b.T, x, w)}; "
              f"invariant kernel (split {splits}) {differing(inv, x, w)}, rel. error {err:.2e}")
        if not args.dry:
            for m in (1, 8, 64):
                xm = x[:m].contiguous()
                t_cublas, t_inv = timed(lambda a, b: a @ b.T, xm, w), timed(inv, xm, w)
                gbps = N * K * 2 / (t_inv * 1e-3) / 1e9
                print(f"   M={m}: cuBLAS {t_cublas * 1e3:.1f} us, invariant {t_inv * 1e3:.1f} us "
                      f"({t_inv / t_cublas:.2f}x; {gbps:.0f} GB/s of weights)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
