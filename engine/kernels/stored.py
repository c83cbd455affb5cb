"""The linear layer that multiplies by weights kept in their stored format (see ``weights.py``).

Why: decoding one token streams every weight once, so bytes per weight set the speed of a CPU
forward; :class:`StoredLinear` hands the stored codes to ``stored.c`` (decoded in registers, fp32
arithmetic) or, in the fast precision, to ``fast.c`` (integer products), and
:class:`StoredEmbedding` decodes only the rows a lookup asks for.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.kernels import native
from engine.kernels.linear import Linear, cpu_layout
from engine.kernels.weights import KIND_IDS, QUANT_KINDS, QuantRows, StoredPanels, cat_rows


class StoredLinear:
    """``y = x @ W.T + b`` with W in its stored format; the drop-in twin of :class:`Linear`.

    ``parts`` are stacked by rows (q|k|v may mix formats in a Q4_K_M file); each part writes its
    own columns of the output. With our kernel every output element is the FMA chain the fp32
    kernel computes on the dequantized weights. Without it (no compiler, no AVX2), the weight is
    dequantized for each call and multiplied exactly as the fp32 fallback would: slow, same answers.
    """

    __slots__ = ("_bias", "_kernel", "fast", "in_features", "layout", "out_features", "parts")

    def __init__(self, parts: list[QuantRows], bias: torch.Tensor | None = None) -> None:
        self.parts = [StoredPanels.from_rows(p) for p in _merge_runs(parts)]
        self.in_features = self.parts[0].k
        self.out_features = sum(p.n for p in self.parts)
        self._bias = bias.float().contiguous() if bias is not None else None
        self.layout = cpu_layout()
        self._kernel = native.load() if self.layout == "native" else None
        self.fast = False  # the fast precision (engine/kernels/fast.c) for q4/q8 parts; set by the model

    @property
    def nbytes(self) -> int:
        """Bytes one product reads (the same in either precision: both read the compact scales)."""
        return sum(p.nbytes for p in self.parts)

    @property
    def dense_weight(self) -> torch.Tensor:
        """The weight as an ordinary fp32 [out, in] tensor (a fresh copy)."""
        return torch.cat([p.dequantize() for p in self.parts])

    def _native(self, x: torch.Tensor, out: torch.Tensor, accumulate: bool) -> None:
        col = 0
        for part in self.parts:
            bias = self._bias[col : col + part.n] if self._bias is not None else None
            view = out[:, col : col + part.n]
            if not (self.fast and self._kernel.stored_linear_fast(x, part, bias, view, accumulate)):
                self._kernel.stored_linear(x, part, bias, view, accumulate)
            col += part.n

    def _fallback(self) -> Linear:
        return Linear(self.dense_weight, self._bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if self._kernel is None or rows.dtype != torch.float32:
            return self._fallback()(x)
        y = torch.empty(rows.shape[0], self.out_features, dtype=torch.float32)
        self._native(rows.contiguous(), y, accumulate=False)
        return y.reshape(*lead, self.out_features)

    def add_into(self, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``residual += x @ W.T + b`` in place (2-D fp32); returns residual."""
        if self._kernel is not None and x.dtype == torch.float32 and residual.is_contiguous():
            self._native(x.contiguous(), residual, accumulate=True)
            return residual
        return residual.add_(self(x))


def _merge_runs(parts: list[QuantRows]) -> list[QuantRows]:
    """Each run of neighbouring parts that share a format stacked into one: q|k of a Q4_K_M file
    whose v is Q6_K becomes two products instead of three (every product call costs its thread
    start-up and its activation quantization, whatever its size)."""
    runs: list[QuantRows] = []
    for part in parts:
        merged = cat_rows([runs[-1], part]) if runs else None
        if merged is not None:
            runs[-1] = merged
        else:
            runs.append(part)
    return runs


class StoredEmbedding:
    """Token embedding lookup from stored rows: only the looked-up rows are decoded (in one call
    of our kernel for 8-, 6- and 4-bit codes: the same values as :meth:`QuantRows.dequantize`)."""

    def __init__(self, rows: QuantRows) -> None:
        self.rows = rows
        quant = rows.kind in QUANT_KINDS and rows.codes.is_contiguous() and rows.scales is not None
        self._kernel = native.load() if quant and cpu_layout() == "native" else None
        if self._kernel is not None:
            self._scales = rows.scales.float().contiguous()
            self._offsets = rows.offsets.float().contiguous() if rows.offsets is not None else None

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows.shape

    def flat(self, ids: torch.Tensor | Sequence[int]) -> torch.Tensor | None:
        """Rows for ``ids`` (a list, or 1-D int64 CPU tensor) as fp32 [len(ids), K] in one kernel call,
        or None where the kernel does not take these rows (then call the embedding): an EAGLE level's
        lookup, where every torch operation around the call costs more than the call."""
        if self._kernel is None:
            return None
        return self._kernel.dequantize_rows(KIND_IDS[self.rows.kind], self.rows.group, self.rows.codes, self._scales,
                                            self._offsets, ids)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        flat = tokens.reshape(-1).to("cpu", torch.int64)
        if self._kernel is not None:
            out = self._kernel.dequantize_rows(KIND_IDS[self.rows.kind], self.rows.group, self.rows.codes,
                                               self._scales, self._offsets, flat.contiguous())
            return out.reshape(*tokens.shape, -1)
        return self.rows.rows(flat).dequantize().reshape(*tokens.shape, -1)
