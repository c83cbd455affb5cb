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
