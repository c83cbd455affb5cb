"""Target hidden states that EAGLE heads read, kept per committed token.

The target's forward computes these anyway (the residual stream entering chosen layers, or the
last hidden state after the final norm); the session asks for them in every forward when a head
is loaded and keeps one row per token in its KV cache, so a drafter switched on mid-conversation
(a hot-swap, a new turn) can catch up without re-running the target.
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
        return torch.cat([out.aux[order.index(layer)] for layer in self.capture_layers], dim=-1)


class FeatureStore:
    """Rows of features aligned with the tokens in the target's KV cache."""

    def __init__(self) -> None:
        self._data: torch.Tensor | None = None
        self.length = 0

    def append(self, rows: torch.Tensor) -> None:
        n = rows.shape[0]
        if self._data is None:
            self._data = rows.new_empty((max(256, 2 * n), rows.shape[1]))
        elif self.length + n > self._data.shape[0]:
            grown = self._data.new_empty((max(2 * self._data.shape[0], self.length + n), self._data.shape[1]))
            grown[: self.length] = self._data[: self.length]
            self._data = grown
        self._data[self.length: self.length + n] = rows
        self.length += n

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def rows(self) -> torch.Tensor:
        if self._data is None:
            raise RuntimeError("no features stored yet")
        return self._data[: self.length]
