"""Dense layers laid out once for skinny matrix products: 1 to ~64 rows times a big weight.

Why: decoding multiplies a handful of rows (1 token, or a draft tree of 2-64 nodes) by every
weight matrix, and on a CPU the verify cost of a tree decides whether speculation pays. The
stock fp32 paths handle these shapes badly: MKL's sgemm repacks the weight on every call, and
both it and oneDNN jump from ~50 ms for one row to ~100 ms for two rows on the 135M model (one
core of a 2-core AVX2 EPYC, weights streamed from DRAM). Splitting the weight into column
blocks ``[N/b, K, b]`` and running one batched product over the blocks keeps each small block
in cache while all rows use it; measured on that machine (layers + LM head, one thread):

    rows          1      4      8     16
    oneDNN     53.5    113    119    146  ms
    blocks     51.3     76     91    122  ms

The blocked product also gives bit-identical results to ``F.linear`` here. On GPUs plain
``F.linear`` (cuBLAS) is already right, so the blocking is CPU-only.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

BLOCK = int(os.environ.get("SPECCHAT_LINEAR_BLOCK", "32"))  # columns per block: 32 best for 1-8 rows


def _blocked_enabled() -> bool:
    return not os.environ.get("SPECCHAT_PLAIN_LINEAR")


class Linear:
    """``y = x @ W.T + b``; x: [..., in] -> [..., out] in x's dtype."""

    __slots__ = ("_bias", "_blocks", "_weight", "in_features", "out_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self._bias = bias.contiguous() if bias is not None else None
        blocked = weight.device.type == "cpu" and weight.dtype == torch.float32 and _blocked_enabled()
        if blocked:
            n, k = weight.shape
            pad = (-n) % BLOCK
            if pad:
                weight = torch.cat([weight, weight.new_zeros(pad, k)])
            self._blocks: torch.Tensor | None = weight.view(-1, BLOCK, k).transpose(1, 2).contiguous()
            self._weight = None
        else:
            self._blocks = None
            self._weight = weight.contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._blocks is None:
            return F.linear(x, self._weight, self._bias)
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        m = rows.shape[0]
        blocks = self._blocks
        out = torch.bmm(rows.expand(blocks.shape[0], m, self.in_features), blocks)  # [N/b, m, b]
        y = out.transpose(0, 1).reshape(m, -1)
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        if self._bias is not None:
            y = y + self._bias
        return y.reshape(*lead, self.out_features)

    @property
    def dense_weight(self) -> torch.Tensor:
        """The weight as an ordinary [out, in] tensor."""
        if self._blocks is None:
            return self._weight
        k = self.in_features
        return self._blocks.transpose(1, 2).reshape(-1, k)[: self.out_features]
