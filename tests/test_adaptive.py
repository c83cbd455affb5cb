"""The cost-aware draft budget: prunes to valid subtrees, follows the evidence, recovers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.adaptive import DraftBudget, subtree
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
        assert gate.pause == 0 and gate.should_draft()
        budget.observe(chain(4), (), verify_ms=14.0, draft_ms=8.0)  # 1 token in 22 ms vs 1 in 10 plain
        pauses.append(gate.pause)
        skipped = 0
        while not gate.should_draft():
            skipped += 1
        assert skipped == pauses[-1]
    assert pauses == [4, 8, 16, 32]


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

    assert sum(run(40, ())) < 10  # losing: mostly paused
    landing = run(60, (1, 2, 3))  # the answer starts copying: 4 tokens per 22 ms
    assert all(landing[-30:]) and budget.gate.next_pause == 4


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
    budget.acceptance.rate = {(d, True, False): accept for d in range(1, 10)}
    return budget


def test_draft_depth_follows_acceptance_and_the_price_of_a_level() -> None:
    assert DraftBudget().draft_depth(5) == 5  # nothing measured: draft what was asked
    assert _depth_budget(0.9, 1.0).draft_depth(5) == 5  # drafts land and levels are cheap
    assert _depth_budget(0.35, 2.0).draft_depth(5) == 1  # weak drafts: one level, not five
    depths = [_depth_budget(a, 2.0).draft_depth(8) for a in (0.3, 0.5, 0.7, 0.9)]
    assert depths == sorted(depths) and depths[0] < depths[-1]
    assert _depth_budget(0.7, 0.5).draft_depth(8) >= _depth_budget(0.7, 4.0).draft_depth(8)


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
    from engine.adaptive import ConfidenceModel

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
