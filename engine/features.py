"""Target hidden states that EAGLE heads read, kept per committed token.

The target's forward computes these anyway (the residual stream entering chosen layers, or the
last hidden state after the final norm); while a method that reads them drafts, the session asks
for them in every forward and keeps one row per token in its KV cache (:class:`FeatureCapture`),
so a drafter switched on mid-conversation (a hot-swap, a new turn) catches up on the rows it lacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class FeatureSpec:
    """Which target states one committed token contributes."""

    capture_layers: tuple[int, ...] = ()  # EAGLE-3: residual entering these layers, concatenated low..high
    final_hidden: bool = False  # EAGLE-1/2: the last layer's output after the final norm

    def forward_kwargs(self) -> dict[str, Any]:
        # the forward captures each layer once, in layer order; extract() restores the head's order
        return {"return_hidden": self.final_hidden, "capture_layers": tuple(sorted(set(self.capture_layers)))}

    def extract(self, out: Any) -> torch.Tensor:
        """[T, F] features from a forward output made with :meth:`forward_kwargs`."""
        if self.final_hidden:
            return out.hidden
        order = sorted(set(self.capture_layers))
        parts = [out.aux[order.index(layer)] for layer in self.capture_layers]
        joined = _side_by_side(parts)
        return joined if joined is not None else torch.cat(parts, dim=-1)


def _side_by_side(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """``parts`` ([T, H] each) as one [T, n*H] view where they already lie side by side in one
    row-major buffer, as the native decoder writes its captured layers (head order = layer order
    for EAGLE-3's usual low..high ids); None otherwise. Why: the concatenation it saves is a copy
    and an allocation in every verify of a feature-reading drafter (a step's commit took ~100 us
    against ~10 us for the baseline's, measured in the decode loop)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if first.dim() != 2:
        return None
    rows, width = first.shape
    n = len(parts)
    if first.stride() != (n * width, 1):
        return None
    step = width * first.element_size()
    storage = first.untyped_storage().data_ptr()
    for j, part in enumerate(parts):
        if (part.shape != first.shape or part.stride() != first.stride() or part.dtype != first.dtype
                or part.device != first.device or part.untyped_storage().data_ptr() != storage
                or part.data_ptr() != first.data_ptr() + j * step):
            return None
    return first.as_strided((rows, n * width), (n * width, 1))


class FeatureStore:
    """Rows of features aligned with the tokens in the target's KV cache."""

    def __init__(self) -> None:
        self._data: torch.Tensor | None = None
        self.length = 0

    def append(self, rows: torch.Tensor, index: list[int] | None = None) -> torch.Tensor:
        """Store ``rows`` (or ``rows[index]``) after the last row; returns the stored rows (a view
        of the store, valid until it is truncated below them). The index is gathered straight into
        the store: one copy, not an indexed tensor and then a copy."""
        n = rows.shape[0] if index is None else len(index)
        if self._data is None:
            self._data = rows.new_empty((max(256, 2 * n), rows.shape[1]))
        elif self.length + n > self._data.shape[0]:
            grown = self._data.new_empty((max(2 * self._data.shape[0], self.length + n), self._data.shape[1]))
            grown[: self.length] = self._data[: self.length]
            self._data = grown
        dst = self._data[self.length: self.length + n]
        if index is None:
            dst.copy_(rows)
        elif index == list(range(index[0], index[0] + n)):  # a chain's kept prefix: one slice
            dst.copy_(rows[index[0]: index[0] + n])
        else:
            torch.index_select(rows, 0, torch.tensor(index, device=rows.device), out=dst)
        self.length += n
        return dst

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def rows(self) -> torch.Tensor:
        if self._data is None:
            raise RuntimeError("no features stored yet")
        return self._data[: self.length]


class FeatureCapture:
    """The session's features: which ones (``spec``), the rows kept, and whether forwards capture now.

    Why not always capture when a head is loaded: the embedded model ships an EAGLE-3 head that is
    loaded for every method (so eagle3 can be chosen mid-chat), and capturing for the baseline or
    n-gram would tax each of their forwards with a copy per layer (and keep CUDA off its CUDA
    graphs). While off, the store keeps its rows for the cached prefix it still covers; turning
    capture on again goes with a catch-up of the rows it lacks (engine/step.py, SpecLoop.use_drafter).
    """

    def __init__(self, spec: FeatureSpec | None) -> None:
        self.spec = spec
        self.store = FeatureStore()
        self.on = False
        self.forward_kwargs: dict[str, Any] = {}  # what the target's forward needs to capture them

    def set(self, on: bool) -> None:
        """Capture in the forwards from now on (when there is a spec), or stop."""
        self.on = on and self.spec is not None
        self.forward_kwargs = self.spec.forward_kwargs() if self.on and self.spec is not None else {}

    def keep(self, out: Any, rows: list[int] | None = None) -> torch.Tensor | None:
        """Store the features of the forward's rows now committed (all rows, or ``rows``); None when off."""
        if not self.on or self.spec is None:
            return None
        return self.store.append(self.spec.extract(out), rows)

    def rows(self) -> torch.Tensor | None:
        """One row per cached token while capturing (what a drafter's reset reads); None when off."""
        return self.store.rows() if self.on else None


class FeatureCaptures:
    """One :class:`FeatureCapture` per distinct :class:`FeatureSpec` the session's drafters read.

    Why several: two feature-reading drafters in one session (an EAGLE-3 head and Medusa heads,
    compared on one prompt) read different target states (layers' residuals vs the last hidden
    state). Each spec keeps its own rows, captured only while a method that reads it drafts;
    drafters that read the same states (EAGLE-1/2 and Medusa) share one store. Every store is cut
    wherever the cached prefix is cut, so the rows any of them holds always belong to the cache.
    """

    def __init__(self) -> None:
        self.off = FeatureCapture(None)  # the capture of methods that read nothing
        self._by_spec: dict[FeatureSpec, FeatureCapture] = {}

    def get(self, spec: FeatureSpec | None) -> FeatureCapture:
        if spec is None:
            return self.off
        if spec not in self._by_spec:
            self._by_spec[spec] = FeatureCapture(spec)
        return self._by_spec[spec]

    def truncate(self, length: int) -> None:
        for capture in self._by_spec.values():
            capture.store.truncate(length)
