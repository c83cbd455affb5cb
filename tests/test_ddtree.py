"""DDTree: the draft tree grown best-first from one DFlash block (engine/drafters/dflash/ddtree.py).

The search is checked against a brute-force enumeration of every path (hypothesis, with ties); the
drafter's trees against the search over the block it kept (``last_block``), with one drafter forward
a step whatever the tree's size; width 1 is the chain it was before, bit for bit; greedy output is the
baseline's for any width and node budget (hypothesis). Sampling's chi-square cases for DDTree trees are
in tests/test_tree_sampling.py.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_dflash import VOCAB, bundle, dflash_session, plain, target, tokens_of_steps
from tiny import TinyTokenizer

from engine.config import ConfigError, SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.dflash.ddtree import Offers, best_paths, ddtree
from engine.drafters.dflash.drafter import DFlashDrafter
from engine.events import Step
from engine.session import Session
from engine.tree import DraftTree


def brute_force(logp: list[list[float]], budget: int) -> list[tuple[int, ...]]:
    """Every path of every depth scored by its summed log-probability (added from the root down),
    sorted by (-score, ranks), the first ``budget``."""
    paths = []
    for depth in range(1, len(logp) + 1):
        for ranks in itertools.product(*(range(len(row)) for row in logp[:depth])):
            neg = 0.0
            for j, r in enumerate(ranks):
                neg -= logp[j][r]
            paths.append((neg, ranks))
    return [ranks for _, ranks in sorted(paths)[:budget]]


# log-probabilities drawn from a few values, so ties between paths (and within a row) are common
_VALUES = st.sampled_from([0.0, -0.25, -0.5, -1.0, -1.5, -2.0, -3.0, -7.0])
_ROWS = st.lists(st.lists(_VALUES, min_size=1, max_size=4).map(lambda r: sorted(r, reverse=True)),
                 min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(logp=_ROWS, budget=st.integers(0, 70))
def test_the_best_first_search_keeps_the_best_paths_by_summed_log_probability(logp, budget) -> None:
    """The search's nodes are the top-``budget`` of all paths (a brute-force enumeration), in key
    order; the set is closed under prefixes, and holds min(budget, every path) nodes."""
    got = best_paths(logp, budget)
    assert got == brute_force(logp, budget)
    total = sum(math.prod(len(row) for row in logp[:d]) for d in range(1, len(logp) + 1))
    assert len(got) == min(budget, total)
    kept = set(got)
    assert all(p[:-1] in kept for p in got if len(p) > 1)


@settings(max_examples=150, deadline=None)
@given(logp=_ROWS, budget=st.integers(1, 40), data=st.data())
def test_the_tree_is_its_paths_stored_parents_first_with_siblings_in_rank_order(logp, budget, data) -> None:
    ids = [data.draw(st.permutations(range(10, 10 + len(row)))) for row in logp]  # distinct tokens a position
    tree = ddtree(7, Offers(ids, logp), budget)
    paths = best_paths(logp, budget)
    assert len(tree) == len(paths) + 1 <= budget + 1 and tree.tokens[0] == 7
    for node, ranks in enumerate(paths, start=1):
        depth, rank = len(ranks) - 1, ranks[-1]
        assert tree.depths[node] == len(ranks) and tree.tokens[node] == ids[depth][rank]
        assert tree.parents[node] == (0 if depth == 0 else paths.index(ranks[:-1]) + 1)
        assert tree.draft_probs[node] == math.exp(logp[depth][rank])
    for kids in tree.children():
        ranks = [paths[c - 1][-1] for c in kids]
        assert ranks == sorted(ranks) and len({tree.tokens[c] for c in kids}) == len(kids)


def test_width_one_is_a_chain_and_an_empty_budget_the_root() -> None:
    logp = [[-0.1], [-0.5], [-0.2]]
    assert ddtree(1, Offers([[4], [5], [6]], logp), 8) == DraftTree.chain(1, [4, 5, 6], [math.exp(v[0]) for v in logp])
    assert ddtree(1, Offers([[4], [5], [6]], logp), 2) == DraftTree.chain(1, [4, 5], [math.exp(v[0]) for v in logp[:2]])
    assert ddtree(1, Offers([[4, 5]], [[-0.1, -0.2]]), 0) == DraftTree.root_only(1)


# the drafter -------------------------------------------------------------------------------------------
def _steps(config: SpecConfig, block: int = 8, prompt: tuple[int, ...] = (3, 4, 5, 6), *, check: bool = True
           ) -> tuple[list[Step], DFlashDrafter, list[DraftTree]]:
    """An answer's steps, its drafter, and the trees the drafter proposed (before any pruning), each
    greedy one checked against the search over the block it came from."""
    b = bundle("z-lab", VOCAB, block)
    made: list[DFlashDrafter] = []
    proposed: list[DraftTree] = []

    def factory() -> DFlashDrafter:
        drafter = b.factory()
        real = drafter.propose

        def propose(history, root, ask, **kwargs):
            tree = real(history, root, ask, **kwargs)
            proposed.append(tree)
            if check:
                _check_against_its_block(drafter, tree, ask)
            return tree

        drafter.propose = propose  # type: ignore[method-assign]
        made.append(drafter)
        return drafter

    s = Session(target(VOCAB), TinyTokenizer(VOCAB), config,
                drafters={"none": NoDrafter, "dflash": factory}, features=b.features)
    steps = [e for e in s.generate_ids(list(prompt)) if isinstance(e, Step)]
    return steps, made[0], proposed


def _check_against_its_block(drafter: DFlashDrafter, tree: DraftTree, config: SpecConfig) -> None:
    """A greedy tree is the brute-force best paths over the top-k of the block the drafter kept."""
    if len(tree) == 1:
        return
    block = drafter.last_block
    values, index = block.logp.topk(min(config.tree_width, VOCAB), dim=-1)
    logp, ids = values.tolist(), index.tolist()
    budget = config.num_draft_tokens - 1
    want = brute_force(logp, budget)
    assert [tree.tokens[i] for i in range(1, len(tree))] == [ids[len(p) - 1][p[-1]] for p in want]
    assert len(tree) <= config.num_draft_tokens and tree.max_depth <= block.logp.shape[0]


@pytest.mark.parametrize(("width", "tokens", "block"), [(2, 12, 8), (4, 33, 8), (3, 6, 4), (5, 64, 8)])
def test_one_drafter_forward_a_step_whatever_the_tree(width: int, tokens: int, block: int) -> None:
    """Without the budget each drafted step is one block forward and a tree of exactly
    num_draft_tokens nodes (every block here offers more paths than that) grown from it."""
    config = SpecConfig(method="dflash", eagle_topk=width, num_draft_tokens=tokens, max_new_tokens=30,
                        adaptive_draft=False)
    before = bundle("z-lab", VOCAB, block).factory().runner.forwards  # the runner is the bundle's, shared
    steps, drafter, proposed = _steps(config, block)
    assert drafter.runner.forwards - before == len(steps) - 1 == len(proposed)  # step 0: the prefill's token
    assert all(len(t) == tokens and not t.is_chain for t in proposed)
    assert all(s.tree == t for s, t in zip(steps[1:], proposed, strict=True))  # verified as proposed
    assert sum(len(s.accepted) for s in steps) > 0
    offers = drafter.last_offers
    assert offers is not None and all(len(row) == min(width, VOCAB) for row in offers.ids)
    assert tokens_of_steps(steps) == plain(VOCAB, config, [3, 4, 5, 6])


def test_width_one_is_todays_chain_bit_for_bit() -> None:
    """At width 1 the drafter's chain (the shared tree search, as before DDTree) is the DDTree of one
    candidate a position: tokens, parents and probabilities, step by step."""
    config = SpecConfig(method="dflash", eagle_topk=1, num_draft_tokens=6, max_new_tokens=30, adaptive_draft=False)
    _, drafter, proposed = _steps(config)
    assert proposed and all(t.is_chain and len(t) == 6 for t in proposed)
    assert drafter.last_offers is None  # the chain path: no tree was searched
    block = drafter.last_block
    best, index = block.logp.max(dim=-1)
    again = ddtree(proposed[-1].tokens[0], Offers([[i] for i in index.tolist()], [[v] for v in best.tolist()]), 5)
    assert again == proposed[-1] and again.draft_probs == proposed[-1].draft_probs


def test_a_width_past_the_node_budget_or_the_vocabulary() -> None:
    """A DDTree grows no levels, so a width past its node budget is allowed (never reached); past the
    drafter's vocabulary it is refused in one line before the answer."""
    SpecConfig(method="dflash", eagle_topk=8, num_draft_tokens=3)
    with pytest.raises(ConfigError, match="eagle_topk=7 is more than the tree holds"):
        SpecConfig(method="eagle3", eagle_topk=7, num_draft_tokens=3)
    drafter = bundle("z-lab", VOCAB, 4).factory()
    with pytest.raises(ConfigError, match="vocabulary of 11 tokens"):
        drafter.check(SpecConfig(method="dflash", eagle_topk=12, num_draft_tokens=20))
    drafter.check(SpecConfig(method="dflash", eagle_topk=11, num_draft_tokens=20))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    block=st.sampled_from([2, 4, 8]),
    width=st.sampled_from([1, 2, 3, 5, 11]),
    draft_tokens=st.sampled_from([2, 3, 8, 16, 40]),
    prompt=st.lists(st.integers(3, VOCAB - 1), min_size=1, max_size=20),
    max_new=st.integers(1, 40),
    adaptive=st.booleans(),
    swap_at=st.integers(0, 8),
    swap=st.sampled_from([None, {"eagle_topk": 1}, {"eagle_topk": 4}, {"num_draft_tokens": 5}]),
)
def test_greedy_ddtree_equals_plain_decoding(block, width, draft_tokens, prompt, max_new, adaptive, swap_at,
                                             swap) -> None:
    """Any width and node budget, with or without the budget's pruning, and either changed mid-answer."""
    config = SpecConfig(method="dflash", eagle_topk=width, num_draft_tokens=draft_tokens, max_new_tokens=max_new,
                        adaptive_draft=adaptive)
    s = dflash_session(bundle("z-lab", VOCAB, block), VOCAB, config)
    out: list[int] = []
    for event in s.generate_ids(prompt):
        if isinstance(event, Step):
            out += [c.id for c in event.committed]
            assert len(event.tree) <= max(draft_tokens, *(swap or {}).values(), 0)
            if event.index == swap_at and swap is not None:
                s.update_config(config.replace(**swap))
    assert out == plain(VOCAB, config, prompt)


@pytest.mark.parametrize("top_p", [0.95, 1.0])  # the tensor path; our kernel's picks
def test_seeded_coupled_ddtree_gives_the_baselines_sample(top_p: float) -> None:
    """Coupled sampling: each position offers its Gumbel-top-k under the target's noise; the answer
    is the seed's, whatever the tree."""
    common = {"max_new_tokens": 30, "temperature": 0.9, "top_p": top_p, "seed": 6}
    config = SpecConfig(method="dflash", eagle_topk=3, num_draft_tokens=10, adaptive_draft=False, **common)
    steps, drafter, proposed = _steps(config, 4, (3, 4, 5), check=False)
    assert any(not t.is_chain for t in proposed) and drafter.last_offers is not None
    assert tokens_of_steps(steps) == plain(VOCAB, config, [3, 4, 5])


def test_the_block_keeps_each_positions_candidates_for_the_app() -> None:
    """``last_block`` keeps the rows, ``last_offers`` the candidates the last tree was grown from:
    each position's top-k, best first, as the tree's nodes carry them."""
    config = SpecConfig(method="dflash", eagle_topk=3, num_draft_tokens=9, max_new_tokens=8, adaptive_draft=False)
    _, drafter, _ = _steps(config)
    block, offers = drafter.last_block, drafter.last_offers
    values, index = block.logp.topk(3, dim=-1)
    assert offers.ids == index.tolist() and offers.logp == values.tolist()
    assert torch.all(values[:, :-1] >= values[:, 1:])


def test_the_budget_chooses_chain_or_tree_and_prunes_what_one_forward_gave() -> None:
    """With the adaptive budget a DDTree method is asked for the configured width or a chain (its
    WidthChoice, as for EAGLE's trees: both measured first, the tree first), never for levels, and
    verifies a subtree of what the one forward proposed; a step at width 1 is the chain."""
    config = SpecConfig(method="dflash", eagle_topk=3, num_draft_tokens=12, max_new_tokens=60)
    before = bundle("z-lab", VOCAB, 8).factory().runner.forwards
    steps, drafter, proposed = _steps(config)
    drafted = [s for s in steps[1:] if not s.draft_paused]
    assert drafted and drafter.runner.forwards - before == len(proposed) == len(drafted)
    assert {s.draft_width for s in drafted} <= {1, 3} and drafted[0].draft_width == 3
    assert all(s.draft_levels == 0 for s in steps)
    for step, tree in zip(drafted, proposed, strict=True):
        assert len(step.tree) <= len(tree) and step.proposed == len(tree)
        assert set(step.tree.tokens) <= set(tree.tokens)
        if step.draft_width == 1:
            assert tree.is_chain
    assert tokens_of_steps(steps) == plain(VOCAB, config, [3, 4, 5, 6])


def test_a_ddtree_step_is_judged_against_its_own_spine_on_the_verify_curve() -> None:
    """WidthChoice's paired chain for a tree from one forward (no levels): the tree's spine of first
    children, committing its accepted first-child run, for the same forward and the verify curve's
    price of spine + 1 nodes at this step's speed; no level line is fitted to a block forward."""
    from engine.adaptive import DraftBudget, spine_length

    budget = DraftBudget(cost_shape={1: 1.0, 3: 1.5, 6: 3.0})
    budget.cost.observe(1, 2.0)
    # root -> a -> b (the spine), a second child of the root and of a
    tree = DraftTree((1, 4, 5, 6, 7, 8), (-1, 0, 1, 0, 1, 2), (1.0, 0.9, 0.8, 0.1, 0.1, 0.7))
    assert spine_length(tree) == 3 and spine_length(DraftTree.root_only(1)) == 0
    budget.gate.settling = False
    budget.observe(tree, (1, 2), 6.0, 1.0, 0, 3)  # kept a, b: the spine's first two
    tokens, ms = budget.width.shadows[3].tokens[-1], budget.width.shadows[3].ms[-1]
    price = budget.cost.estimate(4) / budget.cost.estimate(6)
    assert tokens == 3 and ms == pytest.approx(1.0 + 6.0 * price) and ms < 7.0
    assert not budget.draft_costs and budget.draft_cost.line() is None  # no levels were paid


def test_the_kernels_coupled_offers_are_the_tensor_paths() -> None:
    """Each position's Gumbel-top-k, ranked by log-probability, is the same from our kernel's picks
    and from the perturbed scores' top-k."""
    from engine.drafters.tree_search import coupled_scores
    from engine.sampling import GumbelNoise

    drafter = bundle("z-lab", VOCAB, 8).factory()
    features = torch.randn(3, drafter.runner.spec.feature_width, generator=torch.Generator().manual_seed(0))
    drafter.reset([3, 4, 5], features)
    block = drafter.block(6, 7)
    config = SpecConfig(method="dflash", eagle_topk=4, num_draft_tokens=16, temperature=0.7, seed=2)
    coupled = coupled_scores(config, GumbelNoise(2, VOCAB), block.position, None, drafter.runner.kernel)
    if coupled.picks is None or coupled.picks(block.logp[:1], 1, 4) is None:
        pytest.skip("no native kernel here")
    by_kernel = drafter._offers(block.logp, 4, coupled)
    coupled.picks = None
    by_tensors = drafter._offers(block.logp, 4, coupled)
    assert by_kernel.ids == by_tensors.ids
    torch.testing.assert_close(torch.tensor(by_kernel.logp), torch.tensor(by_tensors.logp))
    assert all(row == sorted(row, reverse=True) for row in by_kernel.logp)
