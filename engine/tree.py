"""The draft tree: the one data structure drafters produce and the verifier consumes, and its verdict.

Node 0 is the root: the last token the target produced, whose K/V is not yet cached.
Nodes are stored in topological order (every parent index is smaller than its child's),
which lets the verifier and the KV compaction walk the tree front to back without sorting.
The :class:`Verdict` lives here, beside the tree it walks, so the host walk (engine/verify.py)
and the device walk (engine/gpu/accept.py) share it without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


class BlockRows(Protocol):
    """A block drafted in one pass, position by position: what a block drafter keeps of its
    one forward so the step's event can show every position's guesses (engine/step.py asks for them
    only where a consumer wants them: a top-k is a pass over the block's rows)."""

    def top(self, k: int) -> list[list[tuple[int, float]]]:
        """Per position after the root (row j: the token j + 1 places after it), the ``k`` most likely
        target ids with their probabilities, best first."""


@dataclass(frozen=True)
class DraftTree:
    """Tokens and shape of one step's proposal.

    ``draft_probs[i]`` is the drafter's probability of node i given its parent (1.0 for the
    root and for drafters, like n-gram lookup, that have no distribution). ``has_probs`` says
    which: False means the 1.0s are placeholders, so a UI must not show them as probabilities.


    ``proposals[i]``, where present, is the distribution over target token ids that node i's
    children were *sampled* from; the verifier then accepts with min(1, p/q) and resamples from
    the residual. Nodes without one had their children chosen deterministically (top-k, lookup)
    and are verified as point masses. Both keep the target's distribution exactly.

    ``source`` names where a drafter with several sources took this tree from ("corpus": the
    n-gram drafter's corpus of the model's own answers; "" otherwise), for the UI.

    ``block``, where present, is the block a block drafter filled in one pass (its per-position
    distributions, :class:`BlockRows`), which the tree was made from; pruning keeps it whole.
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    draft_probs: tuple[float, ...]
    depths: tuple[int, ...] = field(default=())
    proposals: Mapping[int, torch.Tensor] | None = field(default=None, compare=False, repr=False)
    has_probs: bool = field(default=True, compare=False)  # metadata: equal trees stay equal
    source: str = field(default="", compare=False)
    block: BlockRows | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0:
            raise ValueError("a draft tree needs at least the root")
        if len(self.parents) != n or len(self.draft_probs) != n:
            raise ValueError("tokens, parents and draft_probs must have the same length")
        if self.parents[0] != -1:
            raise ValueError("node 0 must be the root (parent -1)")
        for i in range(1, n):
            if not 0 <= self.parents[i] < i:
                raise ValueError(f"node {i} has parent {self.parents[i]}; parents must precede children")
        if not self.depths:
            depths = [0] * n
            for i in range(1, n):
                depths[i] = depths[self.parents[i]] + 1
            object.__setattr__(self, "depths", tuple(depths))

    # construction -------------------------------------------------------------------------
    @classmethod
    def root_only(cls, root: int) -> DraftTree:
        return cls((root,), (-1,), (1.0,))

    @classmethod
    def chain(cls, root: int, drafts: Sequence[int], probs: Sequence[float] | None = None) -> DraftTree:
        """A single path root -> drafts[0] -> drafts[1] ... (prompt lookup, k=1 drafters)."""
        n = len(drafts)
        p = tuple(probs) if probs is not None else (1.0,) * n
        return cls((root, *drafts), tuple(range(-1, n)), (1.0, *p))

    # shape queries ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_drafts(self) -> int:
        return len(self.tokens) - 1

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self) -> list[list[int]]:
        """children()[i] lists node i's children in node order (= draft rank for our drafters)."""
        out: list[list[int]] = [[] for _ in self.tokens]
        for i in range(1, len(self.tokens)):
            out[self.parents[i]].append(i)
        return out

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's first child down to ``node`` (root excluded)."""
        path = []
        while node > 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestor_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[T, T] bool: row i sees node j iff j is i or an ancestor of i. Built as bytes, row from
        parent row, and read in one torch call: a torch operation per node cost ~5-20 us each with
        the caches cold after a forward, and every drafted tree step builds one."""
        n = len(self.tokens)
        rows = [bytearray(n)]
        rows[0][0] = 1
        for i in range(1, n):
            row = bytearray(rows[self.parents[i]])
            row[i] = 1
            rows.append(row)
        return torch.frombuffer(bytearray().join(rows), dtype=torch.bool).view(n, n).to(device)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tokens": list(self.tokens),
            "parents": list(self.parents),
            "depths": list(self.depths),
            "draft_probs": [round(p, 6) for p in self.draft_probs],
            "has_probs": self.has_probs,
        }
        if self.source:
            out["source"] = self.source
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DraftTree:
        return cls(
            tuple(data["tokens"]), tuple(data["parents"]), tuple(data["draft_probs"]), tuple(data["depths"]),
            has_probs=bool(data.get("has_probs", True)), source=str(data.get("source", "")),
        )


@dataclass(frozen=True)
class Verdict:
    """What verification kept of a tree: the accepted path and the target's own next token."""

    accepted: tuple[int, ...]  # node indices on the accepted path, root excluded
    bonus: int  # the token the target produced after that path
