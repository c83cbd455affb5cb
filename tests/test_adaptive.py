"""The cost-aware draft budget: prunes to valid subtrees, follows the evidence, recovers."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.adaptive import _EXPLORE, _GATE_PROBE, DraftBudget, DraftGate, subtree
from engine.costs import LevelCost
from engine.tree import DraftTree


def chain(n: int) -> DraftTree:
    return DraftTree.chain(7, list(range(10, 10 + n - 1)))


@given(st.lists(st.integers(0, 50), min_size=1, max_size=30), st.floats(0.0, 1.0), st.floats(1.0, 3.0))
def test_pruned_tree_is_a_rooted_subtree(parent_seeds, accept, slope) -> None:
    parents = [-1] + [seed % (i + 1) for i, seed in enumerate(parent_seeds)]
    tree = DraftTree(tuple(range(len(parents))), tuple(parents), (1.0,) * len(parents))
    budget = DraftBudget()
    for n in (1, 4, 16):
        budget.cost.observe(n, 10.0 * (1 + (slope - 1) * (n - 1) / 15))
    budget.acceptance.rate = {(d, f, h): accept for d in range(1, 40) for f in (True, False) for h in (True, False)}
    pruned = budget.prune(tree)
    assert pruned.tokens[0] == tree.tokens[0]
    # every kept node keeps its parent: the pruned tree's paths are paths of the original
    original = {tree.tokens[i]: tree.tokens[tree.parents[i]] for i in range(1, len(tree))}
    for i in range(1, len(pruned)):
        assert original[pruned.tokens[i]] == pruned.tokens[pruned.parents[i]]


def test_confident_drafts_on_flat_costs_keep_the_whole_tree() -> None:
    budget = DraftBudget()
    for n in (1, 8):
        budget.cost.observe(n, 10.0)
    budget.acceptance.rate = {(d, True, False): 0.95 for d in range(1, 10)}
    assert len(budget.prune(chain(8))) == 8


def test_useless_drafts_shrink_to_a_plain_step_then_get_retried() -> None:
    budget = DraftBudget()
    budget.cost.observe(1, 10.0)
    budget.cost.observe(8, 20.0)
    tree = chain(8)
    for _ in range(60):  # every draft rejected
        budget.observe(tree, (), 20.0)
    assert len(budget.prune(tree)) == 1
    for _ in range(200):  # plain steps test nothing: estimates drift back to the optimistic prior
        budget.observe(DraftTree.root_only(1), (), 10.0)
    assert len(budget.prune(tree)) > 1


def test_a_budget_stuck_at_the_root_verifies_its_likeliest_draft_now_and_then() -> None:
    """A second node priced above what the 50% prior pays for (a noisy calibration) would keep
    every tree at its root forever, the estimates never tested: every ``_EXPLORE``-th drafted
    step in a row that pruned to the root verifies the likeliest draft instead."""
    budget = DraftBudget(cost_shape={1: 1.0, 2: 1.7, 3: 2.0, 8: 3.0})
    budget.cost.observe(1, 10.0)
    tree = DraftTree(chain(4).tokens, chain(4).parents, chain(4).draft_probs, has_probs=False)  # n-gram's kind
    kept = [len(budget.prune(tree)) for _ in range(2 * _EXPLORE)]
    assert kept == ([1] * (_EXPLORE - 1) + [2]) * 2
    assert budget.prune(tree).tokens == tree.tokens[:1]  # the count starts again
    budget.acceptance.rate = {(1, True, False): 0.9}  # the drafts land: the budget keeps them itself
    assert len(budget.prune(tree)) > 1


def test_subtree_renumbers_parents() -> None:
    tree = DraftTree((1, 2, 3, 4, 5), (-1, 0, 0, 2, 3), (1.0,) * 5)
    sub = subtree(tree, [0, 2, 3])
    assert sub.tokens == (1, 3, 4) and sub.parents == (-1, 0, 1)


def test_gate_pauses_a_drafter_that_costs_more_than_it_saves_with_doubling_pauses() -> None:
    budget = DraftBudget()
    gate = budget.gate
    budget.cost.observe(1, 10.0)
    pauses = []
    for _ in range(4):
        assert gate.should_draft()
        budget.observe(chain(4), (), verify_ms=14.0, draft_ms=8.0)  # settling: the catch-up step is not judged
        for _ in range(_GATE_PROBE - 1):  # a verdict needs a window of drafted steps, never one
            assert gate.pause == 0 and gate.should_draft()
            budget.observe(chain(4), (), verify_ms=14.0, draft_ms=8.0)  # 1 token in 22 ms vs 1 in 10 plain
        assert gate.pause == 0 and gate.rate is None
        budget.observe(chain(4), (), verify_ms=14.0, draft_ms=8.0)
        pauses.append(gate.pause)
        skipped = 0
        while not gate.should_draft():
            skipped += 1
        assert skipped == pauses[-1]
    assert pauses == [4, 8, 16, 32]


def test_gate_judges_a_window_so_one_unlucky_step_does_not_pause_a_paying_drafter() -> None:
    """A head whose draft lands every other step pays over a window though it loses half the steps:
    the verdict is a ratio of sums, not the last step's."""
    budget = DraftBudget()
    budget.cost.observe(1, 10.0)
    drafted = []
    for step in range(200):
        drafted.append(budget.gate.should_draft())
        if drafted[-1]:  # 1 or 2 tokens in 12 ms: 1.5 in 12 on average beats 1 in 10
            budget.observe(chain(2), (1,) if step % 2 else (), verify_ms=11.0, draft_ms=1.0)
        else:
            budget.observe(DraftTree.root_only(7), (), verify_ms=10.0)
    assert all(drafted)


def test_gate_keeps_a_drafter_that_pays_and_never_pauses_cheap_drafting() -> None:
    budget = DraftBudget()
    budget.cost.observe(1, 10.0)
    for _ in range(20):  # 3 tokens in 20 ms beats 1 in 10
        budget.observe(chain(4), (1, 2), verify_ms=14.0, draft_ms=6.0)
        assert budget.gate.should_draft()
    cheap = DraftBudget()
    cheap.cost.observe(1, 10.0)
    for _ in range(20):  # n-gram style: drafting is free, pruning alone decides
        cheap.observe(chain(4), (), verify_ms=14.0, draft_ms=0.1)
        assert cheap.gate.should_draft()


def test_gate_judges_drafting_against_undrafted_steps_not_verifies_that_drafting_slowed() -> None:
    """Plain steps take 10 ms; after drafting (1.5 ms) even a one-token verify takes 12 (the weights
    left the cache meanwhile). Drafting delivers 1.25 tokens a step: 0.089 tokens/ms against plain
    decoding's 0.1. The cost model, fitted to the slowed verifies, prices a plain step at ~12 ms, at
    which drafting would look like a win; the gate reads the undrafted steps and pauses."""
    budget = DraftBudget()
    for _ in range(8):
        budget.observe(DraftTree.root_only(7), (), verify_ms=10.0)  # undrafted steps
    steps = [(DraftTree.root_only(7), (), 12.0), (chain(2), (1,), 13.0), (DraftTree.root_only(7), (), 12.0),
             (chain(2), (), 13.0)]
    for i in range(64):
        if not budget.gate.should_draft():
            break
        tree, accepted, verify = steps[i % 4]
        budget.observe(tree, accepted, verify_ms=verify, draft_ms=1.5)
    assert budget.gate.pause > 0, "drafting at 0.89x plain decoding was not paused"
    assert budget.cost.estimate(1) > 11.0 and budget._plain_ms() == pytest.approx(10.0)


def test_a_window_losing_within_its_spread_drafts_on_without_shortening_the_pauses() -> None:
    """9 tokens in 96 ms against 1 in 10 plain: behind, but within the window's chance spread, so
    drafting goes on; the pauses' doubling is kept, and only a window at par resets it."""
    gate = DraftGate(settling=False, next_pause=16)
    for tokens in (1, 1, 1, 1, 1, 1, 1, 2):
        gate.observe(tokens, 2.0, 10.0, plain_ms=10.0)
    assert gate.pause == 0 and gate.rate is not None and gate.rate < 0.1 and gate.next_pause == 16
    for _ in range(8):  # the drafts land: 2 tokens in 12 ms
        gate.observe(2, 2.0, 10.0, plain_ms=10.0)
    assert gate.pause == 0 and gate.next_pause == 4


def test_gate_resumes_after_the_drafter_lands_again() -> None:
    budget = DraftBudget()
    budget.cost.observe(1, 10.0)

    def run(steps: int, accepted: tuple[int, ...]) -> list[bool]:
        drafted = []
        for _ in range(steps):
            drafted.append(budget.gate.should_draft())
            if drafted[-1]:
                budget.observe(chain(4), accepted, verify_ms=14.0, draft_ms=8.0)
        return drafted

    assert sum(run(300, ())) < 0.2 * 300  # losing: mostly paused, probing a window now and then
    landing = run(200, (1, 2, 3))  # the answer starts copying: 4 tokens per 22 ms
    assert all(landing[-50:]) and budget.gate.next_pause == 4


def test_the_settling_step_pays_for_catch_up_without_being_judged() -> None:
    budget = DraftBudget()
    budget.cost.observe(1, 10.0)
    budget.observe(chain(4), (1, 2), verify_ms=14.0, draft_ms=500.0, levels=3)  # the head reads a long prompt
    assert budget.gate.should_draft() and budget.gate.rate is None
    assert not budget.draft_cost.ms  # nor is the catch-up taken for the price of 3 levels
    budget.observe(chain(4), (1, 2), verify_ms=14.0, draft_ms=6.0, levels=3)
    assert budget.gate.should_draft() and budget.draft_cost.ms == {3: 6.0}


def test_restart_makes_the_next_drafted_step_a_settling_one() -> None:
    """A drafter taking over mid-answer pays its catch-up once: restart() keeps that step unjudged."""
    budget = DraftBudget()
    budget.cost.observe(1, 10.0)
    budget.observe(chain(4), (1, 2), verify_ms=14.0, draft_ms=6.0, levels=3)  # the answer's first step
    budget.observe(chain(4), (1, 2), verify_ms=14.0, draft_ms=6.0, levels=3)
    judged = dict(budget.draft_cost.ms)
    budget.restart()
    budget.observe(chain(4), (), verify_ms=14.0, draft_ms=500.0, levels=3)  # the new drafter's catch-up
    assert budget.draft_cost.ms == judged and budget.gate.should_draft()


def _depth_budget(accept: float, level_ms: float) -> DraftBudget:
    budget = DraftBudget()
    for n in (1, 6):
        budget.cost.observe(n, 10.0 + 0.5 * (n - 1))
    budget.draft_cost.observe(5, 5 * level_ms)
    budget.drafted.rate = {(d, True, False): accept for d in range(1, 10)}
    return budget


def test_draft_depth_follows_acceptance_and_the_price_of_a_level() -> None:
    assert DraftBudget().draft_depth(5) == 5  # nothing measured: draft what was asked
    assert _depth_budget(0.9, 1.0).draft_depth(5) == 5  # drafts land and levels are cheap
    assert _depth_budget(0.35, 2.0).draft_depth(5) == 1  # weak drafts: one level, not five
    depths = [_depth_budget(a, 2.0).draft_depth(8) for a in (0.3, 0.5, 0.7, 0.9)]
    assert depths == sorted(depths) and depths[0] < depths[-1]
    assert _depth_budget(0.7, 0.5).draft_depth(8) >= _depth_budget(0.7, 4.0).draft_depth(8)


def test_draft_depth_takes_the_deepest_of_depths_the_estimates_cannot_tell_apart() -> None:
    """Where a deeper ask's expected rate is within _DEPTH_TIE of the best, it is asked (the stop
    rule can still end a doubtful step early); clearly worse deeper depths are not."""
    from engine.adaptive import _DEPTH_TIE

    def rates(budget: DraftBudget, levels: int) -> list[float]:
        out, expected, path = [], 1.0, 1.0
        for depth in range(1, levels + 1):
            path *= budget.drafted.get(depth, True)
            expected += path
            out.append(expected / (budget.draft_cost.estimate(depth) + budget.cost.estimate(depth + 1)))
        return out

    close = _depth_budget(0.45, 1.5)
    r = rates(close, 5)
    chosen = close.draft_depth(5)
    assert r.index(max(r)) + 1 < chosen and r[chosen - 1] >= (1.0 - _DEPTH_TIE) * max(r)  # a near tie: deeper
    weak = _depth_budget(0.35, 2.0)
    r = rates(weak, 5)
    assert all(rate < (1.0 - _DEPTH_TIE) * r[0] for rate in r[1:]) and weak.draft_depth(5) == 1  # clearly worse


def test_draft_depth_grows_back_once_deeper_drafts_land() -> None:
    budget = _depth_budget(0.2, 2.0)
    assert budget.draft_depth(5) == 1
    for _ in range(80):  # one-level chains whose draft is always accepted
        budget.observe(chain(2), (1,), verify_ms=10.5, draft_ms=2.0, levels=1)
    assert budget.draft_depth(5) > 1


def _candidates(path_probs: list[float]):
    """A chain of candidates with these conditional draft probabilities."""
    import math

    from engine.drafters.tree_search import Candidates

    cands = Candidates()
    parent, score = -1, 0.0
    for depth, p in enumerate(path_probs, start=1):
        score += math.log(p)
        (parent,) = cands.add([depth], [math.log(p)], [score], [parent], depth)
    return cands, parent


def test_confidence_starts_at_the_drafters_word_and_learns_from_verification() -> None:
    from engine.acceptance import ConfidenceModel

    model = ConfidenceModel()
    assert model.get(0.99) > 0.9 and model.get(0.01) < 0.05  # before evidence: trust the drafter
    overconfident = DraftTree((7, 8), (-1, 0), (1.0, 0.99))
    for _ in range(60):
        model.observe(overconfident, ())  # its 99% drafts are always refused
    assert model.get(0.99) < 0.05 and model.get(0.5) == 0.6  # other buckets keep their prior


def test_stop_rule_grows_only_while_the_likeliest_path_pays_for_a_level() -> None:
    budget = DraftBudget()
    assert budget.stop_rule() is None  # nothing measured: grow every level
    budget.cost.observe(1, 10.0)
    budget.draft_cost.observe(1, 1.0)
    budget.draft_cost.observe(2, 3.0)  # a level costs 2 ms: a fifth of a plain step
    stop = budget.stop_rule()
    sure, tip = _candidates([0.9, 0.9])
    assert not stop(sure, [tip])  # 0.81 of a token for 0.2 of a step: grow
    doubtful, tip = _candidates([0.9, 0.1])
    assert stop(doubtful, [tip])  # 0.09 of a token: stop


def test_a_stopped_search_keeps_the_levels_it_grew() -> None:
    import torch

    from engine.drafters.tree_search import grow_tree

    calls = []

    def expand(frontier, cands):
        calls.append(len(frontier))
        return torch.log_softmax(torch.arange(6.0), dim=-1).expand(len(frontier), 6)

    root = torch.log_softmax(torch.arange(6.0), dim=-1)
    full, _, _ = grow_tree(0, root, expand, lambda ix: ix, num_steps=4, topk=1, num_draft_tokens=5)
    assert len(full) == 5 and len(calls) == 3
    calls.clear()
    stopped, _, _ = grow_tree(0, root, expand, lambda ix: ix, num_steps=4, topk=1, num_draft_tokens=5,
                              stop=lambda cands, frontier: len(cands.tokens) >= 2)
    assert len(stopped) == 3 and len(calls) == 1  # two levels, one drafter forward


def test_prune_trusts_the_drafters_own_probability_where_it_gives_one() -> None:
    """Two children of the root, one the head is sure of and one it barely ranked: with a verify
    that pays only for likely drafts, the shaky one is not verified; without probabilities (n-gram)
    both look alike."""
    budget = DraftBudget()
    for n in (1, 2, 3):
        budget.cost.observe(n, 10.0 + 4.0 * (n - 1))  # a node pays when P(accepted) > 0.4
    sure = DraftTree((7, 10, 11), (-1, 0, 0), (1.0, 0.99, 0.02))
    assert budget.prune(sure).tokens == (7, 10)
    blind = DraftTree((7, 10, 11), (-1, 0, 0), (1.0, 1.0, 1.0), has_probs=False)
    budget.acceptance.rate = {(1, True, False): 0.9, (1, False, False): 0.05}
    assert budget.prune(blind).tokens == (7, 10)


def test_distrusted_confidence_buckets_recover_while_untested() -> None:
    """Pruning by confidence stops testing the drafts it distrusts, so their estimate must drift
    back to the bucket's prior on its own, or they would never be verified again."""
    budget = DraftBudget()
    for n in (1, 2):
        budget.cost.observe(n, 10.0 + 2.0 * (n - 1))
    tree = DraftTree((7, 10), (-1, 0), (1.0, 0.6))
    for _ in range(60):  # confident drafts, all refused
        budget.observe(tree, (), 12.0)
    assert budget.confidence.get(0.6) < 0.1 and len(budget.prune(tree)) == 1
    for _ in range(200):
        budget.observe(DraftTree.root_only(7), (), 10.0)
    assert budget.confidence.get(0.6) > 0.5 and len(budget.prune(tree)) == 2


# root; 1 and 2 its first and second child; 3 and 4 their first children
_TREE = DraftTree((7, 10, 11, 12, 13), (-1, 0, 0, 1, 2), (1.0, 0.6, 0.3, 0.6, 0.6))


def _drafted_widths(budget: DraftBudget, steps: int, pays: dict[int, tuple[tuple[int, ...], float]]) -> list[int]:
    """Run ``steps`` drafted steps of two levels; ``pays``: width -> (the accepted path, ms) of a
    step at that width (a tree step verifies _TREE, a chain step the chain of 3)."""
    widths = []
    for _ in range(steps):
        width = budget.draft_width(4)
        accepted, ms = pays[width]
        tree = _TREE if width > 1 else chain(3)
        budget.observe(tree, accepted, verify_ms=ms - 1.0, draft_ms=1.0, levels=2, width=width)
        widths.append(width)
    return widths


def test_width_choice_drafts_chains_where_trees_do_not_pay_and_retries_trees_less_and_less() -> None:
    budget = DraftBudget()
    budget.cost.observe(1, 10.0)
    widths = _drafted_widths(budget, 400, {4: ((1,), 14.0), 1: ((1,), 11.0)})  # same tokens, the tree dearer
    assert widths[:_GATE_PROBE + 1] == [4] * (_GATE_PROBE + 1)  # the configured tree first (after settling)
    assert widths.count(4) < 0.15 * len(widths) and widths[-20:] == [1] * 20
    trials = [i for i in range(1, len(widths)) if widths[i] == 4 and widths[i - 1] == 1]
    gaps = [b - a for a, b in itertools.pairwise(trials)]
    assert len(trials) >= 3 and gaps == sorted(gaps) and gaps[-1] > gaps[0]  # the loser waits longer each time


def test_width_choice_keeps_trees_that_pay() -> None:
    """Trees whose extra tokens come through second children (which no chain drafts) stay on."""
    budget = DraftBudget()
    budget.cost.observe(1, 10.0)
    widths = _drafted_widths(budget, 200, {4: ((2, 4), 14.0), 1: ((1,), 11.0)})
    assert widths.count(1) < 0.15 * len(widths) and widths[-20:] == [4] * 20
    assert DraftBudget().draft_width(1) == 1  # a chain asked for is a chain


def test_width_choice_judges_trees_against_their_own_chains_not_older_text() -> None:
    """Chains measured on hard text (one token a step), trees tried on easy text where every token
    comes down the first children: the tree step's own chain would have committed as much for
    less, so chains stay (comparing the two windows alone, trees won: 3 tokens in 14 ms against
    1 in 11, a difference of text, not of width)."""
    budget = DraftBudget()
    budget.cost.observe(1, 10.0)
    for n in (3, 5):
        budget.cost.observe(n, 10.0 + 0.5 * (n - 1))
    widths = _drafted_widths(budget, 2 * _GATE_PROBE + 2, {4: ((1, 3), 14.0), 1: ((), 11.0)})
    widths += _drafted_widths(budget, 200, {4: ((1, 3), 14.0), 1: ((1, 2), 11.0)})
    assert widths[2 * _GATE_PROBE + 2:].count(4) < 0.15 * 200 and widths[-20:] == [1] * 20


def test_level_cost_fits_a_line_and_forgets_old_prices() -> None:
    cost = LevelCost()
    assert cost.estimate(2) is None
    cost.observe(3, 6.0)
    assert cost.estimate(1) == pytest.approx(2.0) and cost.per_level() == pytest.approx(2.0)  # one count: per level
    for levels in (1, 2, 3, 4) * 25:
        cost.observe(levels, 0.5 + 0.3 * levels)  # the head got cheaper, with a fixed catch-up part
    assert cost.estimate(5) == pytest.approx(2.0, abs=0.05) and cost.per_level() == pytest.approx(0.3, abs=0.02)


def test_a_window_verdict_needs_more_than_chance() -> None:
    """Alternating 1 and 2 tokens a step is noisy; steady 1-token steps are not: the same mean
    rate below plain pauses the steady drafter at once but not the noisy one at the margin."""
    from engine.adaptive import RateWindow

    steady, noisy = RateWindow(), RateWindow()
    for i in range(16):
        steady.add(1, 1.0, 9.5)
        noisy.add(1 + i % 2, 1.0, 14.75)  # 1.5 tokens per 15.75 ms: the same 0.095 tokens a ms
    assert steady.stderr() == 0.0 and noisy.stderr() > 0.005
    plain = 10.0  # 0.097 a ms with the 0.97 margin: both below
    assert steady.rate + steady.stderr() < 0.97 / plain < noisy.rate + noisy.stderr()


def test_levels_that_pruning_drops_do_not_count_as_landing() -> None:
    """Two levels drafted, the second pruned every step: verified nodes all land, but the depth
    choice learns that a second level delivers nothing and stops paying for it."""
    budget = _depth_budget(0.9, 1.0)
    assert budget.draft_depth(2) == 2
    for _ in range(60):
        drafted = chain(3)
        budget.prune(drafted)
        budget._proposed = (drafted, [0, 1], frozenset())  # as if pruning kept the first draft only
        budget.observe(subtree(drafted, [0, 1]), (1,), verify_ms=10.5, draft_ms=2.0, levels=2)
    assert budget.drafted.get(1, True) > 0.9 and budget.drafted.get(2, True) < 0.1
    assert budget.draft_depth(2) == 1


def test_contested_children_are_the_first_of_several() -> None:
    from engine.adaptive import contested_children

    #   0 -> 1 -> 2, 0 -> 3; 1 -> 4 (1 has children 2 and 4), 3 -> 5 (alone)
    tree = DraftTree((9, 1, 2, 3, 4, 5), (-1, 0, 1, 0, 1, 3), (1.0,) * 6, has_probs=False)
    assert contested_children(tree) == {1, 2}
    assert contested_children(DraftTree((9, 1, 2, 3, 4, 5), (-1, 0, 1, 0, 1, 3), (1.0,) * 6)) == frozenset()


def test_an_only_child_and_a_contested_one_are_priced_apart() -> None:
    """An n-gram trie's only continuation lands far more often than the first of several (measured on
    rewrite prompts: 54% against 16% at depth 1); learning them apart keeps the one and drops the other."""
    budget = DraftBudget()
    for n in (1, 2, 3):
        budget.cost.observe(n, 10.0 + 3.0 * (n - 1))  # a node pays when P(kept) > 0.3
    alone = DraftTree((7, 10), (-1, 0), (1.0, 1.0), has_probs=False)
    contested = DraftTree((7, 20, 21), (-1, 0, 0), (1.0, 1.0, 1.0), has_probs=False)
    for _ in range(40):
        budget.observe(budget.prune(alone) and alone, (1,), 13.0)
        budget.prune(contested)
        budget.observe(contested, (), 16.0)
    assert budget.acceptance.get(1, True) > 0.7
    assert budget.acceptance.get(1, True, contested=True) < 0.2
    assert budget.prune(alone).tokens == (7, 10)
    assert budget.prune(contested).tokens == (7,)


def test_later_children_start_and_fade_back_below_first_ones() -> None:
    """A sibling is retried after a refusal, but towards 15%, not the 50% a first child gets."""
    from engine.acceptance import AcceptanceModel

    model = AcceptanceModel()
    assert model.get(1, True) == 0.5 and model.get(1, False) == 0.15
    siblings = DraftTree((7, 10, 11), (-1, 0, 0), (1.0, 1.0, 1.0), has_probs=False)
    for _ in range(30):
        model.observe(siblings, (), contested=frozenset({1}))
    assert model.get(1, False) < 0.01 and model.get(1, True, contested=True) < 0.05
    assert model.get(1, True) == 0.5  # the contested first child is not an only child's evidence
    for _ in range(300):
        model.observe(DraftTree.root_only(7), ())
    assert 0.13 < model.get(1, False) <= 0.15 and 0.13 < model.get(1, True, contested=True) <= 0.15


def test_a_refused_second_draft_recovers_towards_a_trusted_first_one() -> None:
    """Depth one lands 80% (rewrite prompts): a second draft refused early drifts back towards
    that, not only to the 50% prior at which it would never be verified again; where depth one is
    below 70% (chat) it drifts only to the prior."""
    from engine.acceptance import AcceptanceModel

    for first_lands, ceiling in ((True, 0.9), (False, 0.5)):
        model = AcceptanceModel()
        two = DraftTree((7, 10, 11), (-1, 0, 1), (1.0, 1.0, 1.0), has_probs=False)
        for _ in range(20):
            model.observe(two, (1,))  # the first draft lands, the second is refused
        assert model.get(2, True) < 0.2
        one = DraftTree((7, 10), (-1, 0), (1.0, 1.0), has_probs=False)
        for k in range(400):  # then only depth one is verified: it lands 80% or 20% of the time
            model.observe(one, (1,) if (k % 5 != 0) == first_lands else ())
        above = model.get(1, True)
        assert (above > 0.7) == first_lands
        assert model.get(2, True) > (0.6 if first_lands else 0.45)
        assert model.get(2, True) <= min(ceiling, max(above, 0.5)) + 1e-9


def test_trees_with_probabilities_do_not_price_the_trees_without() -> None:
    """An n-gram drafter sends both: its corpus's trees (priced by their probabilities) and its
    conversation's (priced by depth). The corpus's refused drafts must not make the conversation's
    look worse, so only trees without probabilities teach the by-depth estimates."""
    budget = DraftBudget({n: 1.0 + 0.1 * (n - 1) for n in range(1, 65)})
    with_probs = DraftTree((1, 2, 3), (-1, 0, 1), (1.0, 0.5, 0.5), source="corpus")
    without = DraftTree((1, 2, 3), (-1, 0, 1), (1.0, 1.0, 1.0), has_probs=False)
    before = budget.acceptance.get(1, True)
    for _ in range(30):
        budget.prune(with_probs)
        budget.observe(with_probs, (), verify_ms=11.0)  # refused every time
    assert budget.acceptance.get(1, True) == before and budget.confidence.get(0.5) < 0.2
    for _ in range(30):
        budget.prune(without)
        budget.observe(without, (1, 2), verify_ms=12.0)  # kept every time
    assert budget.acceptance.get(1, True) > 0.9


def test_width_choice_measures_a_new_topk_against_its_own_chains() -> None:
    """A hot-swapped top-k is measured afresh: its trees are judged against the chains inside
    them, not against the chains inside the old top-k's trees."""
    budget = DraftBudget()
    budget.cost.observe(1, 10.0)
    _drafted_widths(budget, 60, {4: ((1,), 14.0), 1: ((1,), 11.0)})  # top-k 4 trees lose
    widths = []
    for _ in range(60):  # top-k 2: trees whose second children land pay
        width = budget.draft_width(2)
        accepted, ms = {2: ((2, 4), 14.0), 1: ((1,), 11.0)}[width]
        budget.observe(_TREE if width > 1 else chain(3), accepted, verify_ms=ms - 1.0, draft_ms=1.0, levels=2,
                       width=width)
        widths.append(width)
    assert widths[:_GATE_PROBE] == [2] * _GATE_PROBE and widths[-20:] == [2] * 20
    assert len(budget.width.shadows[2]) <= len(budget.width.windows[2])
