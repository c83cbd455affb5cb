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


def assert_rounds_within(out: torch.Tensor, exact: torch.Tensor, atol: float, rtol: float) -> None:
    """``out`` (any float dtype) is what rounding some value within ``atol + rtol * |exact|`` of the
    float64 ``exact`` to ``out.dtype`` gives: out lies between the roundings of exact - e and exact + e
    (rounding is monotonic). For bf16 outputs this is as strict as equality with the rounded exact
    result wherever that is not within e of a rounding boundary, and it does not ask for the one
    rounding a host's fp32 BLAS happens to land on where it is."""
    exact = exact.double()
    e = atol + rtol * exact.abs()
    lo, hi = (exact - e).to(out.dtype).double(), (exact + e).to(out.dtype).double()
    got = out.double()
    bad = (got < lo) | (got > hi)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        at = [float(t.flatten()[i]) for t in (got, lo, hi, exact)]
        raise AssertionError(f"{int(bad.sum())} of {bad.numel()} outputs off; first at flat index {i}: {at[0]!r} "
                             f"outside [{at[1]!r}, {at[2]!r}] (exact {at[3]!r})")
