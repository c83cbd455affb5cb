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

import torch

_TINY = 1e-12


def target_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0) -> torch.Tensor:
    """The distribution plain sampling draws from: softmax(logits / T), then top-k, then top-p."""
    logits = logits.float() / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


class GumbelNoise:
    """Gumbel(0, 1) noise over the vocabulary for each absolute position, from a keyed stream."""

    def __init__(self, seed: int, vocab_size: int, keep: int = 128) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._keep = keep

    def at(self, position: int) -> torch.Tensor:
        g = self._cache.get(position)
        if g is None:
            key = hashlib.blake2b(f"{self.seed}:{position}".encode(), digest_size=8).digest()
            gen = torch.Generator().manual_seed(int.from_bytes(key, "little") & ((1 << 63) - 1))
            u = torch.rand(self.vocab_size, generator=gen, dtype=torch.float64).clamp_(_TINY, 1 - 1e-16)
            g = (-torch.log(-torch.log(u))).float()
            self._cache[position] = g
            if len(self._cache) > self._keep:
                self._cache.popitem(last=False)
        return g


def perturbed_scores(logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
                     noise: torch.Tensor) -> torch.Tensor:
    """log p + g, with -inf outside what top-k/top-p keep; argmax is a sample from p."""
    probs = target_probs(logits, temperature, top_p, top_k)
    return torch.log(probs.clamp_min(0)).nan_to_num(neginf=float("-inf")) + noise.to(probs.device)


def coupled_predictions(logits: torch.Tensor, depths: tuple[int, ...], first_position: int, noise: GumbelNoise,
                        temperature: float, top_p: float, top_k: int) -> list[int]:
    """The sampled next token after each tree node: node i sits at ``first_position + depths[i]``
    and its next token is sampled with the noise of the position after it."""
    out = []
    for i, depth in enumerate(depths):
        scores = perturbed_scores(logits[i], temperature, top_p, top_k, noise.at(first_position + depth + 1))
        out.append(int(scores.argmax()))
    return out
