"""Deciding which drafted tokens the target keeps.

Greedy: walk from the root, each time taking the child whose token is the target's argmax at
the current node; the argmax where no child matches is the bonus token. The output is exactly
plain greedy decoding's, whatever the tree.

Sampling: recursive rejection sampling with point-mass proposals (the drafters here propose
deterministic top-k / lookup tokens, so q(x) = 1 for the proposed token). At a node with target
distribution p, siblings are tried in draft order: accept x with probability p(x); on rejection
set p(x) = 0 and renormalise. If every child is refused, the next token is drawn from the
residual p. This keeps the target's distribution exactly (SpecInfer / EAGLE).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.gpu import on_gpu
from engine.tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    accepted: tuple[int, ...]  # node indices on the accepted path, root excluded
    bonus: int  # the token the target produced after that path


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    """logits: [T, V], row i = the target's prediction after node i."""
    if logits.is_cuda and on_gpu(logits, len(tree)):
        from engine.gpu.accept import verify_greedy_gpu

        return verify_greedy_gpu(tree, logits)  # the walk on the device, one host sync
    predicted = logits.argmax(dim=-1).tolist()
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


def target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The distribution plain sampling would draw from: softmax(logits / T), then top-p."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator).item())


def verify_sampling(
    tree: DraftTree,
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None = None,
) -> Verdict:
    if logits.is_cuda and on_gpu(logits, len(tree)):
        from engine.gpu.accept import verify_sampling_gpu

        return verify_sampling_gpu(tree, logits, temperature, top_p, generator)
    children = tree.children()
    node, accepted = 0, []
    while True:
        p = target_probs(logits[node], temperature, top_p)
        for child in children[node]:
            token = tree.tokens[child]
            u = torch.rand((), generator=generator).item()
            if u < float(p[token]):
                accepted.append(child)
                node = child
                break
            p[token] = 0.0
            p = p / p.sum()
        else:
            return Verdict(tuple(accepted), sample_from(p, generator))
