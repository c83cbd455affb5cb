"""Coupled sampling's pieces (engine/sampling.py): the keyed Gumbel noise, and the draw in our kernel
against the same draw in torch."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kernels import native
from engine.sampling import GumbelNoise, coupled_sample, perturbed_scores, target_probs

needs_kernel = pytest.mark.skipif(native.load() is None, reason=f"no native kernel: {native.why_not}")


def test_the_noise_is_a_function_of_seed_and_position_and_is_gumbel() -> None:
    a, b = GumbelNoise(7, 49152), GumbelNoise(7, 49152, keep=1)
    g = a.at(3)
    assert g.dtype == torch.float32 and g.shape == (49152,)
    b.at(4)  # evicts position 3 from b's cache: drawn again, the same
    assert torch.equal(b.at(3), g) and not torch.equal(a.at(4), g) and not torch.equal(GumbelNoise(8, 49152).at(3), g)
    # Gumbel(0, 1): mean the Euler-Mascheroni constant, variance pi^2 / 6 (~5 standard errors here)
    assert abs(g.double().mean().item() - 0.5772) < 0.03 and abs(g.double().var().item() - math.pi**2 / 6) < 0.1


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.sampled_from([0.3, 0.7, 1.0, 1.5]), st.integers(0, 2**31), st.booleans())
def test_the_kernels_draw_is_torchs(vocab: int, temperature: float, seed: int, ties: bool) -> None:
    """Same bits: ``logits * (1/T) + noise`` rounded twice, the first index of the maximum."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, generator=gen) * 4
    if ties:  # a handful of values only: equal scores everywhere, the lower index must win
        logits = logits.round()
    noise = GumbelNoise(seed, vocab).at(0)
    if ties:
        noise = torch.zeros(vocab)
    want = int((logits * (1.0 / temperature) + noise).argmax())
    assert native.perturbed_argmax(logits, 1.0 / temperature, noise) == want
    assert coupled_sample(logits, temperature, 1.0, 0, noise) == want
    assert int(perturbed_scores(logits, temperature, 1.0, 0, noise).argmax()) == want


@needs_kernel
def test_a_nan_is_drawn_where_torch_draws_it() -> None:
    logits = torch.zeros(40)
    logits[17] = float("nan")
    assert native.perturbed_argmax(logits, 1.0, torch.zeros(40)) == int((logits + torch.zeros(40)).argmax()) == 17


def test_top_p_and_top_k_keep_their_processing() -> None:
    """With top-p or top-k the draw stays among the tokens they keep, whatever the noise says."""
    logits = torch.tensor([5.0, 4.0, 0.0, -1.0])
    noise = torch.tensor([0.0, 0.0, 50.0, 50.0])  # would pick a dropped token if it were ignored
    assert coupled_sample(logits, 1.0, 0.9, 0, noise) in (0, 1)
    assert coupled_sample(logits, 1.0, 1.0, 2, noise) in (0, 1)
    assert coupled_sample(logits, 1.0, 1.0, 0, noise) in (2, 3)  # plain: the noise may pick anything


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 700), st.sampled_from([0.05, 0.5, 1.0, 3.0]), st.sampled_from([0.3, 0.9, 0.99]),
       st.integers(0, 2**31))
def test_top_p_keeps_the_smallest_prefix_that_reaches_it(vocab: int, spread: float, top_p: float, seed: int) -> None:
    """Against the definition in float64 (the whole vocabulary sorted): the same tokens kept, found
    among the largest 64, 512, or by the sort, whichever the prefix ends in."""
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(seed)) * spread
    probs = target_probs(logits, 1.0, top_p)
    exact = torch.softmax(logits.double(), dim=-1)
    sorted_p, order = exact.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(dim=-1) - sorted_p
    if ((before - top_p).abs() < 1e-5).any():
        return  # a prefix whose mass is top_p within fp32 rounding: either answer is right
    keep = torch.zeros_like(exact, dtype=torch.bool).scatter_(-1, order, before < top_p)
    assert torch.equal(probs > 0, keep)
    assert torch.allclose(probs.sum(dim=-1), torch.ones(3))


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 700), st.sampled_from([0.5, 1.0, 3.0]),
       st.sampled_from([(0.9, 0), (1.0, 5), (0.7, 20), (1.0, 0)]), st.integers(0, 2**31))
def test_the_draw_among_the_kept_tokens_is_the_draw_over_the_vocabulary(vocab, spread, processing, seed) -> None:
    """coupled_sample takes its argmax over what top-k / top-p keep, unnormalised; perturbed_scores
    (the drafters' view) over the whole vocabulary, renormalised: the same token."""
    top_p, top_k = processing
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * spread
    noise = GumbelNoise(seed, vocab).at(1)
    want = int(perturbed_scores(logits, 0.8, top_p, top_k, noise).argmax())
    assert coupled_sample(logits, 0.8, top_p, top_k, noise) == want
    assert target_probs(logits, 0.8, top_p, top_k)[want] > 0


@pytest.mark.parametrize("top_p,top_k", [(1.0, 0), (0.9, 0), (1.0, 5)])
def test_a_temperature_near_zero_is_the_argmax_not_nan(top_p: float, top_k: int) -> None:
    """logits / 1e-38 overflowed to inf, inf - inf in the softmax made NaN, and every answer was one
    token repeated; the knob now refuses such a value (--temperature 0 is greedy), and the
    distribution stays finite anyway: all its mass on the largest logit."""
    logits = torch.tensor([[1.0, 5.0, -3.0, 4.0, 2.0, 0.5]])
    probs = target_probs(logits, 1e-38, top_p, top_k)
    assert torch.isfinite(probs).all()
    assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_the_temperature_knob_refuses_a_value_too_near_zero() -> None:
    from engine.config import SpecConfig
    from engine.knobs import KNOBS, ConfigError

    with pytest.raises(ConfigError, match=r"use --temperature 0 for greedy"):
        SpecConfig(temperature=1e-38)
    assert SpecConfig(temperature=0.0).greedy and SpecConfig(temperature=1e-3).temperature == 1e-3
    assert "0 = greedy; otherwise at least 0.001" in KNOBS["temperature"].describe()
