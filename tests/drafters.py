"""Drafters for engine tests: random trees, optionally steered towards the right answer.

An oracle that knows the baseline's continuation makes many drafts correct, so the tests
exercise long accepted paths, branch switches and KV compaction, not only rejections.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from engine.config import SpecConfig
from engine.tree import DraftTree


class RandomTreeDrafter:
    name = "standalone"
    needs_features = False
    pays_per_level = False

    def __init__(self, seed: int = 0, oracle: dict[tuple[int, ...], int] | None = None,
                 hit_rate: float = 0.7, vocab: int = 97) -> None:
        self.rng = random.Random(seed)
        self.oracle = oracle or {}
        self.hit_rate = hit_rate
        self.vocab = vocab

    def check(self, config: SpecConfig) -> None:
        pass

    def reset(self, history: Sequence[int], features=None) -> None:
        pass

    def observe(self, committed: Sequence[int], features=None) -> None:
        pass

    def truncate(self, length: int) -> None:
        pass

    def propose(self, history: Sequence[int], root: int, config: SpecConfig, *, noise=None, stop=None) -> DraftTree:
        tokens, parents = [root], [-1]
        for _ in range(config.num_draft_tokens - 1):
            parent = self.rng.randrange(len(tokens))
            siblings = {tokens[j] for j in range(len(tokens)) if parents[j] == parent}
            token = self.rng.randrange(self.vocab)
            if self.rng.random() < self.hit_rate:
                path, q = [], parent
                while q > 0:
                    path.append(tokens[q])
                    q = parents[q]
                token = self.oracle.get((*history, root, *path[::-1]), token)
            if token in siblings:
                continue
            tokens.append(token)
            parents.append(parent)
        return DraftTree(tuple(tokens), tuple(parents), tuple(self.rng.random() for _ in tokens))
