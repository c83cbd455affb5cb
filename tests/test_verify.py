"""Acceptance rules: greedy equals argmax decoding; sampling keeps the target distribution."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kernels import native
from engine.kernels.native import row_argmax
from engine.tree import DraftTree
from engine.verify import target_probs, verify_greedy, verify_sampling


def test_greedy_walks_the_matching_children_and_returns_the_bonus() -> None:
    tree = DraftTree((9, 4, 5, 6, 7), (-1, 0, 0, 2, 2), (1.0,) * 5)
    logits = torch.full((5, 10), -5.0)
    logits[0, 5] = 1  # root predicts 5 -> node 2
    logits[2, 7] = 1  # node 2 predicts 7 -> node 4
    logits[4, 3] = 1  # node 4 predicts 3: no child, bonus
    v = verify_greedy(tree, logits)
    assert v.accepted == (2, 4) and v.bonus == 3


def test_greedy_with_a_lone_root_is_plain_decoding() -> None:
    logits = torch.zeros(1, 10)
    logits[0, 8] = 2
    assert verify_greedy(DraftTree.root_only(1), logits).bonus == 8


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = target_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 1.0, 0.75)
    torch.testing.assert_close(probs, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampling_verification_keeps_the_target_distribution(temperature: float, top_p: float) -> None:
    """First emitted token ~ p(root); second token given an accepted child c ~ p(c)."""
    g = torch.Generator().manual_seed(0)
    vocab = 6
    # root children: tokens 1, 3, 0 (draft order); node 1 (token 1) has children 2, 4
    tree = DraftTree((5, 1, 3, 0, 2, 4), (-1, 0, 0, 0, 1, 1), (1.0,) * 6)
    logits = torch.randn(6, vocab, generator=g)
    logits[0, 1] = logits[0].max() + 0.5  # make the branch with children likely enough to test
    p_root = target_probs(logits[0], temperature, top_p)
    p_node1 = target_probs(logits[1], temperature, top_p)
    n = 12_000
    first: Counter[int] = Counter()
    second_after_1: Counter[int] = Counter()
    for _ in range(n):
        v = verify_sampling(tree, logits, temperature, top_p, g)
        emitted = [tree.tokens[i] for i in v.accepted] + [v.bonus]
        first[emitted[0]] += 1
        if v.accepted and v.accepted[0] == 1:
            second_after_1[emitted[1]] += 1
    emp_first = torch.tensor([first[t] / n for t in range(vocab)])
    assert (emp_first - p_root).abs().max() < 0.02
    m = sum(second_after_1.values())
    emp_second = torch.tensor([second_after_1[t] / m for t in range(vocab)])
    assert (emp_second - p_node1).abs().max() < 0.035


@pytest.mark.skipif(native.load() is None, reason="no native kernel here")
@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 4), n=st.integers(1, 70), seed=st.integers(0, 2**31 - 1),
       levels=st.integers(1, 4), specials=st.lists(st.sampled_from(["nan", "inf", "-inf", "-0"]), max_size=3))
def test_native_argmax_is_torch_argmax(rows: int, n: int, seed: int, levels: int, specials: list[str]) -> None:
    """Greedy verification reads the argmax through our kernel: the first index of the maximum,
    ties (few distinct values make many) and NaN (first NaN wins) answered as torch answers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (rows, n), generator=g).float()
    for i, s in enumerate(specials):
        x[i % rows, int(torch.randint(0, n, (), generator=g))] = {"nan": float("nan"), "inf": float("inf"),
                                                                  "-inf": float("-inf"), "-0": -0.0}[s]
    assert native.load().argmax_rows(x.contiguous()) == x.argmax(dim=-1).tolist()
    assert row_argmax(x) == x.argmax(dim=-1).tolist()


def test_native_argmax_on_a_vocabulary_row() -> None:
    x = torch.randn(3, 49152, generator=torch.Generator().manual_seed(1))
    x[1, 40000] = x[1, 7] = 100.0  # a tie far apart: the first wins
    assert row_argmax(x) == x.argmax(dim=-1).tolist() == [int(x[0].argmax()), 7, int(x[2].argmax())]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=0, max_size=20))
def test_the_ancestor_mask_shows_each_node_itself_and_its_ancestors(picks: list[int]) -> None:
    parents = [-1] + [p % (i + 1) for i, p in enumerate(picks)]  # each node's parent comes before it
    tree = DraftTree(tuple(range(len(parents))), tuple(parents), (1.0,) * len(parents))
    mask = tree.ancestor_mask()
    assert mask.dtype == torch.bool and mask.shape == (len(tree), len(tree))
    for i in range(len(tree)):
        seen = {0, i, *tree.path_to(i)}
        assert [j for j in range(len(tree)) if mask[i, j]] == sorted(seen)
