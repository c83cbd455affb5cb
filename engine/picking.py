"""How the target's tokens are chosen from its logits, and the random state that chooses them.

Why one object: the first token after a prefill and the tokens a verify keeps must be chosen the
same way for every drafter (greedy argmax; coupled sampling, whose noise is a function of the seed
and the position alone; or rejection sampling from the session's generator), and the drafter
drafts with the same noise the verify will use. Keeping the generator, the answer's noise stream
and those three rules together keeps the session's loop about steps, not about randomness.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from engine.config import SpecConfig
from engine.sampling import GumbelNoise, coupled_predictions, coupled_sample, target_probs
from engine.tree import DraftTree, Verdict
from engine.verify import sample_from, verify_greedy, verify_predicted, verify_sampling


class Picker:
    """The session's random state and the rules that turn target logits into kept tokens."""

    def __init__(self, model: Any, seed: int | None) -> None:
        self._model = model  # its vocab_size sizes the noise, read when an answer first samples
        self.generator = torch.Generator(device="cpu")
        self._stream: GumbelNoise | None = None
        self._answer_seed = 0
        self.reseed(seed)

    def reseed(self, seed: int | None) -> None:
        """Seed the generator (a fresh random seed for None)."""
        self.generator.manual_seed(seed if seed is not None else random.getrandbits(63))

    def new_answer(self) -> None:
        """Draw the seed of an unseeded answer's noise stream (each answer samples afresh)."""
        self._answer_seed = int(torch.randint(0, 2**62, (), generator=self.generator))

    def noise(self, config: SpecConfig) -> GumbelNoise | None:
        """The coupled-sampling noise for this answer (None when greedy or rejection sampling).
        With a seed it is a function of the seed alone, so every answer to the same prompt, with any
        drafter, is the same sample; without one each answer draws a fresh stream."""
        if config.greedy or config.sampling != "coupled":
            return None
        seed = config.seed if config.seed is not None else self._answer_seed
        if self._stream is None or self._stream.seed != seed:
            self._stream = GumbelNoise(seed, self._model.vocab_size)
        return self._stream

    def first_token(self, logits: torch.Tensor, config: SpecConfig, position: int) -> int:
        """The token after the prompt, from the last prompt token's logits at ``position``."""
        if config.greedy:
            return int(logits.argmax())
        noise = self.noise(config)
        if noise is not None:
            return coupled_sample(logits, config.temperature, config.top_p, config.top_k, noise.at(position))
        return sample_from(target_probs(logits, config.temperature, config.top_p, config.top_k), self.generator)

    def verdict(self, tree: DraftTree, logits: torch.Tensor, config: SpecConfig, start: int) -> Verdict:
        """The path of ``tree`` the target keeps, and the token after it; ``start``: the cache
        position of the tree's root."""
        if config.greedy:
            return verify_greedy(tree, logits)
        noise = self.noise(config)
        if noise is not None:
            return verify_predicted(tree, coupled_predictions(
                logits, tree.depths, start, noise, config.temperature, config.top_p, config.top_k))
        return verify_sampling(tree, logits, config.temperature, config.top_p, self.generator, config.top_k)
