"""The protocol every drafter follows.

A drafter sees the whole token history of the conversation (prompt, earlier turns and the
answer so far, ending with the root) and proposes a :class:`DraftTree` whose node 0 is the root.
After verification it observes what was committed, so stateful drafters (the n-gram cache, the
EAGLE draft KV cache) stay in step with the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from engine.config import SpecConfig
from engine.tree import DraftTree


class Drafter(Protocol):
    name: str
    # True when the drafter needs target hidden states in observe() (EAGLE heads).
    needs_features: bool
    # True when each level of ``config.num_steps`` costs a model forward (EAGLE heads, a draft
    # model): the adaptive budget may then ask for fewer levels (engine.adaptive.draft_depth).
    # Drafters without it (n-gram: a lookup) always get the configured depth.
    pays_per_level: bool = False

    def reset(self, history: Sequence[int]) -> None:
        """Forget per-sequence state and take ``history`` (tokens already in the target cache)."""

    def propose(self, history: Sequence[int], root: int, config: SpecConfig) -> DraftTree:
        """Draft a tree rooted at ``root``; ``history`` ends just before the root."""

    def observe(self, committed: Sequence[int], features: torch.Tensor | None = None) -> None:
        """``committed``: tokens now in the target cache since the last call (root + accepted drafts)."""

    def truncate(self, length: int) -> None:
        """The target cache was cut back to ``length`` tokens (a new turn re-rendered the prompt)."""


class NoDrafter:
    """The baseline: a tree of the root alone, so each step is one plain decoding step."""

    name = "none"
    needs_features = False

    def reset(self, history: Sequence[int]) -> None:
        pass

    def propose(self, history: Sequence[int], root: int, config: SpecConfig) -> DraftTree:
        return DraftTree.root_only(root)

    def observe(self, committed: Sequence[int], features: torch.Tensor | None = None) -> None:
        pass

    def truncate(self, length: int) -> None:
        pass
