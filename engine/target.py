"""What the engine asks of a target model and its KV cache: the protocols every backend meets.

Why protocols rather than probing (``getattr(model, "precision", "")``): a probe hides which
backends lack what, and a default chosen at the call site silently differs from one chosen at
the next. :class:`engine.models.llama.LlamaModel` (our forward) and
:class:`engine.models.hf.HFModel` (transformers) both declare every member below, saying in one
place what the one-precision, torch-product backend does not have.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

import torch

from engine.gpu.graphs import GraphCounts


class TargetCache(Protocol):
    """The target's KV cache: ``length`` tokens committed, room for ``capacity``."""

    length: int
    capacity: int

    def commit(self, keep: Sequence[int] | int) -> None:
        """Keep the last forward's rows ``keep`` (or its first ``keep`` rows) after the committed ones."""

    def truncate(self, length: int) -> None:
        """Forget every token after the first ``length``."""

    def grow(self, capacity: int) -> None:
        """Make room for ``capacity`` tokens, keeping what is cached."""


class TargetModel(Protocol):
    """A target the session drafts for, verifies with and caches."""

    device: torch.device
    dtype: torch.dtype
    weights: str  # "stored" (q4/q8/bf16 blocks our kernels read) or "fp32": draft heads take the same form
    ops: Any  # our native kernel where the forward runs it (draft heads call it too), else None
    # "exact" or "fast" where the backend has both arithmetics (settable), "" where it computes in one
    precision: str

    @property
    def fast_available(self) -> bool:
        """Whether the fast precision can run here (stored weights and the native kernel)."""

    @property
    def rows_independent(self) -> bool:
        """Whether a row's result is the same however many rows share a forward (K/V reusable across
        conversations: engine/conversation.py's preamble)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def graph_counts(self) -> GraphCounts | None:
        """The verify forward's CUDA graphs captured and replayed; None where it runs eagerly."""

    @property
    def context_limit(self) -> int:
        """Tokens the model attends to: prompt and answer together must fit."""

    def new_cache(self, capacity: int) -> TargetCache: ...

    def forward(self, tokens: torch.Tensor, cache: Any, *, positions: torch.Tensor | None = None,
                tree_mask: torch.Tensor | None = None, logits: Literal["all", "last", "none"] = "all",
                return_hidden: bool = False, capture_layers: Sequence[int] = ()) -> Any:
        """Run ``tokens`` on top of ``cache`` (a tree with ``positions`` and ``tree_mask``); returns
        the logits per row and, when asked, the hidden states drafters read."""
