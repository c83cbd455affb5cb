"""The fast precision's matrix product in torch: the definition ``fast.c`` computes bit for bit.

Activations are quantized per row and per block of the weight's scale group to 8-bit integers
(``d = max|x| / 127``, ``xq = rint(x / d)``); each block's integer dot product with the weight's
own codes is exact, and the blocks are scaled and summed in a fixed order (see fast.c). This
module is the reference the kernel tests compare against, and the path for CPUs without the
kernel's instructions (slow, the same numbers).
"""

from __future__ import annotations

import torch

from engine.kernels.weights import QuantRows

FAST_KINDS = ("q4", "q8", "q6")


def quantize_activations(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [M, K] fp32 -> (xq [M, K] int64 in -127..127, d [M, K/group] fp32, sums [M, K/group] int64)."""
    m, k = x.shape
    blocks = x.float().view(m, k // group, group)
    d = blocks.abs().amax(-1) / 127.0
    safe = torch.where(d == 0, torch.ones_like(d), d)
    xq = torch.where(d[..., None] == 0, torch.zeros_like(blocks), torch.round(blocks / safe[..., None]))
    xq = xq.to(torch.int64)
    return xq.view(m, k), d, xq.sum(-1)


def fast_linear_reference(x: torch.Tensor, rows: QuantRows, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, N] = the fast precision's x @ W.T (+ bias) for a q4/q8/q6 weight in row form (q6 as
    the q8 form of its values: the kernel's sums of u * x - 32 * sum(x) are those integers)."""
    if rows.kind not in FAST_KINDS:
        raise ValueError(f"the fast precision has no integer product for {rows.kind!r} weights")
    if rows.kind == "q6":
        rows = rows.to_q8()
    g = rows.group
    xq, d, sx = quantize_activations(x, g)
    m, k = xq.shape
    n = rows.shape[0]
    codes = rows.codes.to(torch.int64).view(n, k // g, g)
    xb = xq.view(m, k // g, g)
    acc = torch.zeros(m, n, dtype=torch.float32)
    for b in range(k // g):
        isum = (xb[:, b] @ codes[:, b].T).float()  # exact: |isum| < 2^24
        acc = acc + isum * (rows.scales[:, b][None, :] * d[:, b][:, None])
        if rows.offsets is not None:
            acc = acc + rows.offsets[:, b][None, :] * (d[:, b] * sx[:, b].float())[:, None]
    if bias is not None:
        acc = acc + bias.float()
    return acc


def fast_bf16_reference(x: torch.Tensor, rows: QuantRows, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [M, N] = the fast precision's x @ W.T (+ bias) for a bf16 weight: what ``fast_bf16.c``
    computes with vdpbf16ps. x is rounded to bf16 (to nearest even); each output is one fp32 chain
    over the pairs of k in order, the odd k's product added before the even k's, each sum rounded
    once (a product of two bf16 values is exact in fp32). bf16 denormals count as zero, as the
    instruction reads them."""
    if rows.kind != "bf16":
        raise ValueError(f"fast_bf16_reference takes bf16 weights, not {rows.kind!r}")
    xb = _bf16_daz(x.float().to(torch.bfloat16))
    w = _bf16_daz(rows.codes.view(torch.bfloat16))
    acc = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    for j in range(0, x.shape[1], 2):
        acc = acc + xb[:, j + 1, None] * w[None, :, j + 1]
        acc = acc + xb[:, j, None] * w[None, :, j]
    if bias is not None:
        acc = acc + bias.float()
    return acc


def _bf16_daz(t: torch.Tensor) -> torch.Tensor:
    """bf16 values as fp32, denormals as zero of their sign."""
    f = t.float()
    return torch.where(f.abs() < torch.finfo(torch.float32).tiny, f * 0.0, f)
