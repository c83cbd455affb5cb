"""References for float results whose bits do not depend on the host.

Why: torch's CPU matrix products (MKL, oneDNN, OpenBLAS) choose their kernel, blocking and
summation order by shape, ISA (``ATEN_CPU_CAPABILITY``, AVX2 or AVX-512) and thread count, so an fp32
reference computed with them moves by a few ulps from one machine to the next, and a fixed
tolerance that one machine passes another can fail. These helpers compare against the exact
product computed in float64 instead, with the worst-case bound of fp32 summation in any order, so
the verdict is the same on every machine, and a wrong weight, block or scale (an error of the size
of a term, not of an ulp) still fails.
"""

from __future__ import annotations

import torch

U32 = 2.0**-24  # fp32 unit roundoff


def gamma(n: int, u: float = U32) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound on a sum of n rounded terms."""
    return n * u / (1 - n * u)


def assert_linear_within_fp32_bound(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                    bias: torch.Tensor | None = None) -> None:
    """``y`` is ``x @ weight.T (+ bias)`` computed in fp32 with any summation order (FMA or not):
    |y - exact| <= gamma_{K+1} * (|x| @ |weight|.T + |bias|), exact computed in float64 (whose own
    error, K * 2^-53 of the same magnitudes, is far inside the fp32 bound)."""
    xd, wd = x.double(), weight.double()
    exact = xd @ wd.T
    scale = xd.abs() @ wd.abs().T
    if bias is not None:
        exact = exact + bias.double()
        scale = scale + bias.double().abs()
    k = x.shape[-1]
    bound = gamma(k + 1) * scale + torch.finfo(torch.float32).tiny
    err = (y.double() - exact).abs()
    worst = int((err - bound).flatten().argmax())
    assert bool((err <= bound).all()), (
        f"{int((err > bound).sum())} of {err.numel()} outputs outside the fp32 bound; worst at flat index {worst}: "
        f"error {float(err.flatten()[worst]):.3g} > bound {float(bound.flatten()[worst]):.3g}")
