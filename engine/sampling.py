"""Sampling from the target: its processed distribution, and drafter-invariant (coupled) sampling.

:func:`target_probs` is the distribution plain sampling draws from; the host and device
verifiers (engine/verify.py, engine/gpu/accept.py) and the drafters all process logits with it.

Coupled sampling: the sampled token at position t is argmax(log p_t + g_t).

``g_t`` is Gumbel noise drawn from a stream keyed by (seed, t). By the Gumbel-max trick that
argmax is an exact sample from p_t (the target's processed distribution: temperature, top-k,
top-p), and it depends on nothing but the seed, the position and the target's logits. So:

* verification is a greedy walk in which each node's "prediction" is that sample: lossless;
* the answer does not depend on the drafter, the tree knobs or the adaptive budget (whose
  pruning follows measured timings): a seeded run reproduces, and equals plain sampling with the
  same seed token for token, which makes ``bench``'s identical check meaningful at T > 0;
* drafters use the same noise for their own distributions (Gumbel-top-k, i.e. sampling without
  replacement from q), so a drafter whose q is close to p proposes the very token the target
  will sample: P(match) >= (1 - TV) / (1 + TV) for one draft, more with k of them.

The alternative, recursive rejection sampling (``sampling="rejection"``, engine/verify.py), accepts
a little more often with sampled chains but gives different answers for different trees.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import torch

from engine.kernels.native import perturbed_argmax

_TINY = 1e-12


def target_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0) -> torch.Tensor:
    """The distribution plain sampling draws from: softmax(logits / T), then top-k, then top-p."""
    probs = _softmax(logits, temperature, top_k)
    if top_p < 1.0:
        order, kept = _nucleus(probs, top_p)
        probs = torch.zeros_like(probs).scatter_(-1, order, kept)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def _softmax(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """softmax(logits / T) over the top-k logits (all of them for 0), zero elsewhere.

    The row's largest logit is taken off before the division (the softmax is the same): a small T
    then sends the others towards -inf, never the largest to inf, so no inf - inf makes a NaN."""
    logits = logits.float()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits, dim=-1)


_NUCLEUS_TRIES = (64, 512)  # candidates the nucleus is looked for among before the whole vocabulary is sorted


def _nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-p's candidates: (token ids by probability, descending; their probabilities, zero past the
    smallest prefix whose mass reaches ``top_p``; the first token always stays). The prefix is looked
    for among the largest 64, then 512 probabilities, and only where it ends beyond those is the
    whole vocabulary sorted. Why: sorting the embedded model's 49,152 probabilities took 2.8 ms, most
    of a sampled step with top-p set, where the largest 64 take ~0.1 ms; on MT-bench at T 0.7 the
    nucleus at 0.9 held 2 tokens at the median, 16 at the 90th percentile, over 64 on 0.6% of steps
    (a flat distribution, whose nucleus spans thousands, pays ~0.5 ms more than the sort alone)."""
    vocab = probs.shape[-1]
    for k in (*(k for k in _NUCLEUS_TRIES if k < vocab), vocab):
        top, order = probs.topk(k, dim=-1) if k < vocab else probs.sort(dim=-1, descending=True)
        drop = (top.cumsum(dim=-1) - top) >= top_p
        if k == vocab or bool(drop[..., -1].all()):  # every row's prefix ended inside the k
            break
    return order, top.masked_fill(drop, 0.0)


class GumbelNoise:
    """Gumbel(0, 1) noise over the vocabulary for each absolute position, from a keyed stream."""

    def __init__(self, seed: int, vocab_size: int, keep: int = 128) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._keep = keep

    def at(self, position: int) -> torch.Tensor:
        """[vocab] fp32 noise for ``position``: float64 uniforms from numpy's PCG64 keyed by (seed,
        position), through -log(-log(u)) in float64. Why PCG64: torch's CPU generator (mt19937) took
        163 us for the embedded model's 49,152 uniforms, PCG64 85 us, and a sampled answer draws one
        vector per token."""
        g = self._cache.get(position)
        if g is None:
            key = hashlib.blake2b(f"{self.seed}:{position}".encode(), digest_size=8).digest()
            u = np.random.Generator(np.random.PCG64(int.from_bytes(key, "little"))).random(self.vocab_size)
            g = torch.from_numpy(u).clamp_(_TINY, 1 - 1e-16).log_().neg_().log_().neg_().float()
            self._cache[position] = g
            if len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        return g


def perturbed_scores(logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
                     noise: torch.Tensor) -> torch.Tensor:
    """log p + g up to one constant a row, with -inf outside what top-k/top-p keep: its argmax (and
    top-k) is a sample from p (without replacement). Without top-k or top-p processing it is
    logits / T + g: the softmax's normaliser is the same for every entry of a row, so leaving it out
    orders them alike, in two float passes instead of five (our kernels compute the same, see
    :func:`coupled_sample`)."""
    if _plain(logits.shape[-1], top_p, top_k):
        return logits.float() * (1.0 / temperature) + noise.to(logits.device)
    probs = target_probs(logits, temperature, top_p, top_k)
    return torch.log(probs.clamp_min(0)).nan_to_num(neginf=float("-inf")) + noise.to(probs.device)


def _plain(vocab: int, top_p: float, top_k: int) -> bool:
    """No top-k or top-p processing: every token keeps its probability."""
    return top_p >= 1.0 and not 0 < top_k < vocab


def coupled_sample(logits: torch.Tensor, temperature: float, top_p: float, top_k: int, noise: torch.Tensor) -> int:
    """The token coupled sampling draws from one [vocab] row of logits: the argmax of log p + g, up to
    one constant (so ``perturbed_scores``'s). Without top-k or top-p it runs in our kernel where it can
    (one pass over the vocabulary, ~130 us less a row than torch's three); with them, the argmax is
    taken over the tokens they keep only (renormalising shifts every kept score alike), not over a
    vocabulary of log(0) + g: 0.9 ms a step less with top-p 0.9 (docs/history/benchmarks-sessions.md,
    "Session 29")."""
    vocab = logits.shape[-1]
    if _plain(vocab, top_p, top_k):
        fast = perturbed_argmax(logits, 1.0 / temperature, noise)
        if fast is not None:
            return fast
        return int(perturbed_scores(logits, temperature, top_p, top_k, noise).argmax())
    if logits.dim() != 1:
        return int(perturbed_scores(logits, temperature, top_p, top_k, noise).argmax())
    probs = _softmax(logits, temperature, top_k)
    if top_p < 1.0:
        order, kept = _nucleus(probs, top_p)
    else:  # top-k alone: every token it keeps (ties at the k-th included, as the softmax has them)
        order = torch.nonzero(probs > 0).squeeze(-1)
        kept = probs[order]
    scores = torch.log(kept) + noise.to(kept.device)[order]  # log 0 = -inf: the dropped never win
    return int(order[scores.argmax()])


def coupled_predictions(logits: torch.Tensor, depths: tuple[int, ...], first_position: int, noise: GumbelNoise,
                        temperature: float, top_p: float, top_k: int) -> list[int]:
    """The sampled next token after each tree node: node i sits at ``first_position + depths[i]``
    and its next token is sampled with the noise of the position after it."""
    return [coupled_sample(logits[i], temperature, top_p, top_k, noise.at(first_position + depth + 1))
            for i, depth in enumerate(depths)]
