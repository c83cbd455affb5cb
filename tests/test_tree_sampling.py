"""Lossless sampling: speculative output follows the target's distribution, trees and chains alike.

On a 5-token vocabulary the exact joint distribution of the first three answer tokens is
computed from the target, and a chi-square test compares it with many seeded speculative runs.
Rejection sampling: EAGLE-3 trees (point-mass drafts), EAGLE-3, standalone and DFlash chains whose
drafts are *sampled* and verified with min(1, p/q), and a DDTree grown from a DFlash block's per-position
top-k (point masses, engine/drafters/dflash/drafter.py says why that is exact). Coupled sampling (one
seed per run): EAGLE-3 and standalone trees drafted with Gumbel-top-k, a DFlash block with Gumbel-top-1
per position, and a DDTree over each position's Gumbel-top-k. The seeds
are fixed, so the test is deterministic; a wrong residual or acceptance rule shifts the counts far
past the threshold.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter

import pytest
import torch
from heads import head_config, head_state
from tiny import TinyTokenizer, family_config, our_model

from engine.config import SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.eagle import EagleDrafter
from engine.drafters.eagle_checkpoint import read_head
from engine.drafters.eagle_head import EagleHead
from engine.drafters.standalone import StandaloneDrafter
from engine.events import Step
from engine.features import FeatureSpec
from engine.session import Session
from engine.verify import target_probs

V = 5
PROMPT = [1, 3, 4]
NEW = 3
SAMPLES = 1000


@functools.cache
def target():
    return our_model("llama", 4, num_hidden_layers=6, vocab_size=V)[0]


def exact(temperature: float, top_p: float, top_k: int) -> dict[tuple[int, ...], float]:
    """P(first NEW tokens) under plain sampling, by enumerating prefixes."""
    m = target()
    out: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(V), repeat=NEW):
        cache = m.new_cache(len(PROMPT) + NEW + 2)
        logits = m.forward(torch.tensor(PROMPT + list(seq[:-1])), cache).logits[len(PROMPT) - 1:]
        probs = target_probs(logits, temperature, top_p, top_k)
        out[seq] = float(torch.prod(probs[torch.arange(NEW), torch.tensor(seq)]))
    return out


def chi_square_p(counts: Counter, probs: dict[tuple[int, ...], float], n: int) -> float:
    """p-value of Pearson's test, cells with expected count < 5 pooled into one."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for seq, p in probs.items():
        expected = n * p
        if expected < 5:
            pooled_obs += counts.get(seq, 0)
            pooled_exp += expected
            continue
        stat += (counts.get(seq, 0) - expected) ** 2 / expected
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    df = cells - 1
    return float(1 - torch.special.gammainc(torch.tensor(df / 2), torch.tensor(stat / 2)))


def eagle3_factory():
    m = target()
    cfg = {**family_config("llama"), "num_hidden_layers": 6, "vocab_size": V}
    spec, weights = read_head(head_config(cfg, "eagle3", draft_vocab=4), head_state(cfg, "eagle3", draft_vocab=4,
                                                                                    seed=2),
                              kind=None, target=m.config)
    head = EagleHead(spec, weights, m)
    return (lambda: EagleDrafter(head)), FeatureSpec(capture_layers=spec.capture_layers())


def standalone_factory():
    draft = our_model("llama", 9, num_hidden_layers=1, vocab_size=V)[0]
    return (lambda: StandaloneDrafter(draft, V)), None


@functools.cache
def dflash_factory():
    """A random z-lab-layout DFlash drafter (tests/dflash_drafts.py) for the 5-token target."""
    import tempfile
    from pathlib import Path

    from dflash_drafts import write_dflash

    from engine.drafters.draft_loader import load_draft

    cfg = {**family_config("llama"), "num_hidden_layers": 6, "vocab_size": V}
    folder = write_dflash(Path(tempfile.mkdtemp(prefix="specchat-dflash-")), cfg, block=4, seed=2)
    b = load_draft(str(folder), target(), TinyTokenizer(vocab_size=V))
    return b.factory, b.features


FACTORIES = {"eagle3": eagle3_factory, "standalone": standalone_factory, "dflash": dflash_factory}


CASES = [
    # (sampling, drafter, topk, steps, draft tokens, temperature, top_p, top_k)
    ("rejection", "eagle3", 2, 3, 6, 1.0, 1.0, 0),  # a tree: point-mass drafts
    ("rejection", "eagle3", 1, 3, 4, 0.8, 1.0, 3),  # a chain of sampled drafts, target top-k
    pytest.param("rejection", "standalone", 1, 2, 3, 1.0, 0.9, 0, marks=pytest.mark.slow),  # sampled chain, top-p
    ("coupled", "eagle3", 2, 3, 6, 1.0, 1.0, 0),  # Gumbel-top-k tree
    # Gumbel-top-k tree from a draft model, top-p and top-k
    pytest.param("coupled", "standalone", 2, 2, 5, 0.8, 0.9, 3, marks=pytest.mark.slow),
    # a DFlash block: every draft sampled from its own position's row, one forward (topk/steps unused)
    ("rejection", "dflash", 1, 1, 4, 1.0, 1.0, 0),
    ("coupled", "dflash", 1, 1, 4, 0.8, 0.9, 3),  # Gumbel-top-1 per position, top-p and top-k
    # DDTree: 5 nodes best-first over the block's 3 positions, 2 or 3 candidates each, one forward
    ("rejection", "dflash", 2, 1, 6, 1.0, 1.0, 0),  # top-k per position, verified as point masses
    ("coupled", "dflash", 3, 1, 6, 0.8, 0.9, 3),  # Gumbel-top-k per position, top-p and top-k
]


@pytest.mark.parametrize(("sampling", "method", "topk", "steps", "tokens", "temperature", "top_p", "top_k"), CASES)
def test_speculative_sampling_keeps_the_target_distribution(sampling, method, topk, steps, tokens, temperature,
                                                             top_p, top_k) -> None:
    factory, features = FACTORIES[method]()
    config = SpecConfig(method=method, eagle_topk=topk, num_steps=steps, num_draft_tokens=tokens,
                        max_new_tokens=NEW, temperature=temperature, top_p=top_p, top_k=top_k, seed=1234,
                        adaptive_draft=False, sampling=sampling)
    s = Session(target(), TinyTokenizer(vocab_size=V, stop_ids=frozenset()), config,
                drafters={"none": NoDrafter, method: factory}, features=features)
    counts = sample_answers(s, config)
    assert chi_square_p(counts, exact(temperature, top_p, top_k), SAMPLES) > 1e-3
    if topk > 1:  # the trees were trees: some node had siblings
        trees = [e.tree for e in s.generate_ids(PROMPT, config.replace(seed=0)) if isinstance(e, Step)]
        assert any(not t.is_chain for t in trees)


def sample_answers(session: Session, config: SpecConfig) -> Counter:
    """How often each answer to PROMPT came out in SAMPLES runs (coupled sampling is a function of
    the seed: one seed per sample); fails when drafts were hardly ever accepted, since the test
    would then not exercise the tree."""
    counts: Counter = Counter()
    accepted = 0
    for run in range(SAMPLES):
        seq = []
        override = config.replace(seed=run) if config.sampling == "coupled" else None
        for event in session.generate_ids(PROMPT, override):
            if isinstance(event, Step):
                seq += [c.id for c in event.committed]
                accepted += len(event.accepted)
        counts[tuple(seq)] += 1
    # the chain case lands ~285 drafts per 1,000 answers (mean over 100 seeds, sd ~18): a floor
    # of 200 says "the tree was exercised" without hanging on one seed's stream
    assert accepted > SAMPLES // 5, "drafts were hardly ever accepted: the test would not exercise the tree"
    return counts


def test_the_chi_square_check_detects_a_wrong_distribution() -> None:
    probs = exact(1.0, 1.0, 0)
    wrong = Counter({seq: round(SAMPLES * (0.7 * p + 0.3 / len(probs))) for seq, p in probs.items()})
    assert chi_square_p(wrong, probs, sum(wrong.values())) < 1e-3


def test_coupled_sampling_with_the_target_as_draft_accepts_every_draft() -> None:
    """The drafter uses the noise of the exact positions the target samples at: with q = p every
    Gumbel-top-1 draft is the token the target samples, at every depth."""
    draft = target()
    config = SpecConfig(method="standalone", eagle_topk=1, num_steps=4, num_draft_tokens=5, max_new_tokens=41,
                        temperature=1.0, seed=3, adaptive_draft=False)
    s = Session(target(), TinyTokenizer(vocab_size=V, stop_ids=frozenset()), config,
                drafters={"none": NoDrafter, "standalone": lambda: StandaloneDrafter(draft, V)})
    events = list(s.generate_ids(PROMPT))
    assert events[-1].stats.tau > 4.5
