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

FAST_KINDS = ("q4", "q8")


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
    """y [M, N] = the fast precision's x @ W.T (+ bias) for a q4/q8 weight in row form."""
    if rows.kind not in FAST_KINDS:
        raise ValueError(f"the fast precision has no integer product for {rows.kind!r} weights")
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
