"""Deciding which drafted tokens the target keeps.

Greedy: walk from the root, each time taking the child whose token is the target's argmax at
the current node; the argmax where no child matches is the bonus token. The output is exactly
plain greedy decoding's, whatever the tree.

Sampling: recursive rejection sampling over each node's children, in draft order (SpecInfer /
EAGLE). At a node with target distribution p:

* children chosen deterministically (top-k trees, n-gram lookup) are point masses, q = δ_x:
  accept x with probability p(x); on rejection set p(x) = 0 and renormalise;
* children *sampled* from a draft distribution q (``DraftTree.proposals``): accept x with
  probability min(1, p(x)/q(x)); on rejection p <- normalise(max(p - q, 0)).

If every child is refused the next token is drawn from what is left of p; after the last
accepted node it is drawn from that node's p (the bonus). Either way the committed tokens are
distributed exactly as plain sampling from the target would give.

:class:`Picker` chooses between these rules for a session, and holds the random state they draw
from: the first token after a prefill and the tokens a verify keeps must be chosen the same way
for every drafter (greedy argmax; coupled sampling, whose noise is a function of the seed and the
position alone; or rejection sampling from the session's generator), and the drafter drafts with
the same noise the verify will use.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from engine.config import SpecConfig
from engine.gpu import on_gpu
from engine.kernels.native import row_argmax
from engine.sampling import GumbelNoise, coupled_predictions, coupled_sample, target_probs
from engine.tree import DraftTree, Verdict


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    """logits: [T, V], row i = the target's prediction after node i."""
    if logits.is_cuda and on_gpu(logits, len(tree)):
        from engine.gpu.accept import verify_greedy_gpu

        return verify_greedy_gpu(tree, logits)  # the walk on the device, one host sync
    return verify_predicted(tree, row_argmax(logits))


def verify_predicted(tree: DraftTree, predicted: list[int]) -> Verdict:
    """Walk from the root along children equal to the target's token after each node (its argmax,
    or its coupled sample, engine/sampling.py); the first miss is the bonus."""
    if len(tree) == 1:
        return Verdict((), predicted[0])
    children = tree.children()
    tokens = tree.tokens
    node, accepted = 0, []
    while True:
        want = predicted[node]
        nxt = next((c for c in children[node] if tokens[c] == want), None)
        if nxt is None:
            return Verdict(tuple(accepted), want)
        accepted.append(nxt)
        node = nxt


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One sample per row of ``probs`` ([V] -> [1], [R, V] -> [R, 1]), on ``probs``' device: the
    first token whose cumulative probability (float64) exceeds one uniform draw times the row's
    total, so a zero-probability token is never drawn and rows need not sum to exactly one.

    Why not ``torch.multinomial``: on a 49k vocabulary it took 0.5 ms a call on the 2-core VM,
    a sixth of a plain step, and a rejection-sampled EAGLE-3 step calls it twice (the draft's
    sample and the bonus): 20% of its time (docs/history/benchmarks-sessions.md, "Session 37"); a
    cumulative sum and a binary search take ~0.05 ms. The uniforms come from ``generator`` on its own
    device (the session's and drafters' seeded generators live on the host), so a seed gives the same
    answer on any device; only the rows travel."""
    rows = probs.reshape(-1, probs.shape[-1])
    host = generator.device if generator is not None else rows.device
    cdf = rows.to(host, torch.float64).cumsum(-1)
    u = torch.rand(rows.shape[0], generator=generator, dtype=torch.float64, device=host) * cdf[:, -1]
    picks = torch.searchsorted(cdf, u[:, None], right=True).clamp_(max=rows.shape[-1] - 1)
    return picks.view(*probs.shape[:-1], 1).to(probs.device)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from the distribution ``probs`` [V], drawn with ``generator`` (see :func:`draw`)."""
    return int(draw(probs, generator).item())


def verify_sampling(
    tree: DraftTree,
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None = None,
    top_k: int = 0,
) -> Verdict:
    if logits.is_cuda and top_k == 0 and not tree.proposals and on_gpu(logits, len(tree)):
        from engine.gpu.accept import verify_sampling_gpu

        return verify_sampling_gpu(tree, logits, temperature, top_p, generator)
    children = tree.children()
    proposals = tree.proposals or {}
    node, accepted = 0, []
    while True:
        p = target_probs(logits[node], temperature, top_p, top_k)
        q = proposals.get(node)
        for child in children[node]:
            token = tree.tokens[child]
            u = torch.rand((), generator=generator).item()
            if q is None:
                ok = u < float(p[token])
            else:
                qx = float(q[token])
                ok = qx > 0.0 and u * qx < float(p[token])
            if ok:
                accepted.append(child)
                node = child
                break
            if q is None:
                p[token] = 0.0
                p = p / p.sum()
            else:
                residual = (p - q.to(p.dtype)).clamp_(min=0.0)
                total = residual.sum()
                if total > 0:  # zero only if p == q, where a rejection cannot happen but rounding can
                    p = residual / total
        else:
            return Verdict(tuple(accepted), sample_from(p, generator))


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
