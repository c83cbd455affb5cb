"""Which blocks a DFlash drafter trains and is measured on, and what each position's label is.

A block is anchored at an answer token ``a`` (at inference: the last token the target produced,
whose own features are not computed yet): it sees the target's features of tokens ``0..a-1`` and
the anchor, and its position ``j`` (1..block_size-1) guesses the token ``j`` places later. The
label there is what greedy verification would accept: the target's argmax after ``a + j - 1``
tokens, *while the answer follows the target's greedy path from the anchor* (each token after the
anchor equal to the argmax before it). On a greedy answer that is every position; on a sampled
one the first sampled deviation ends the block's labels, since past it the stored argmax answers
a prefix greedy decoding would never have written. Positions past the conversation's end have no
label either.

Training samples ``anchors`` random anchors per conversation and step (seeded, so a resumed run
draws the same ones); evaluation takes every anchor of the held-out answers.
"""

from __future__ import annotations

import torch


def eligible_anchors(answer_start: int, argmax: torch.Tensor) -> torch.Tensor:
    """[M] positions a that can anchor a block: answer tokens (a >= answer_start) whose next
    token's label (the argmax after a) is known; the conversation's last token never is."""
    n = argmax.shape[0]
    a = torch.arange(max(answer_start, 0), max(n - 1, 0))
    return a[argmax[a] >= 0]


def sample_anchors(eligible: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """Up to ``count`` of ``eligible`` drawn without replacement, in ascending order."""
    if eligible.numel() <= count:
        return eligible
    pick = torch.randperm(eligible.numel(), generator=generator)[:count]
    return eligible[pick].sort().values


def greedy_labels(ids: torch.Tensor, argmax: torch.Tensor, anchors: torch.Tensor, block_size: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels [N, block_size - 1] target ids, valid [N, block_size - 1] bool) of the blocks at
    ``anchors``: column j - 1 is position j's label, the target's argmax after token a + j - 1,
    valid while known and on the greedy path from the anchor (valid is a prefix of each row)."""
    n = ids.shape[0]
    p = anchors[:, None] + torch.arange(block_size - 1)[None, :]  # the token whose argmax labels position j
    inside = p <= n - 2
    q = p.clamp(max=max(n - 2, 0))
    labels = argmax[q]
    known = inside & (labels >= 0)
    # the greedy path continues past p iff the next token is the argmax there
    follows = known & (ids[(q + 1).clamp(max=n - 1)] == labels)
    on_path = torch.ones_like(known)
    on_path[:, 1:] = follows[:, :-1].long().cumprod(dim=1).bool()
    valid = known & on_path
    return torch.where(valid, labels, -1), valid


def resolve_gamma(gamma: float | None, block_size: int) -> float:
    """The position-weight decay: as given, or block_size / 2 (4 for blocks of 8, 8 for 16: about
    the values DFlash's authors suggest, 4 and 7)."""
    return block_size / 2 if gamma is None else gamma


def position_weights(block_size: int, gamma: float) -> torch.Tensor:
    """[block_size - 1] loss weights exp(-(k - 1) / gamma) of positions k = 1..block_size-1 (gamma 0:
    all 1). Why decay: position k is accepted only when 1..k-1 were, so the early ones matter most."""
    k = torch.arange(1, block_size, dtype=torch.float32)
    return torch.ones_like(k) if gamma == 0 else torch.exp(-(k - 1) / gamma)


def accepted_runs(correct: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[N] each block's accepted length: its leading run of correct guesses among valid labels."""
    ok = (correct & valid).long()
    return ok.cumprod(dim=1).sum(dim=1)


def acceptance_counts(runs: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[3, block_size - 1] counts per position k = 1..: blocks whose first k guesses were all
    accepted (hits), blocks with k labels (tries: a block near the answer's end counts only where it
    has them), and those of them whose first k - 1 were accepted (reached)."""
    k = torch.arange(1, valid.shape[1] + 1)
    labelled = valid.long().sum(dim=1)[:, None]
    runs = runs[:, None]
    has = labelled >= k
    return torch.stack([(runs >= k).sum(0), has.sum(0), (has & (runs >= k - 1)).sum(0)])
