"""Teaching mode says when the adaptive budget dropped drafted tokens."""

from __future__ import annotations

from engine.events import CommittedToken, Step
from engine.tree import DraftTree
from specchat.tui.teaching import explain_step


def test_pruned_drafts_are_explained() -> None:
    step = Step(index=3, tree=DraftTree.root_only(5), tree_text=("a",), bonus=9,
                committed=(CommittedToken(9, "target", " b"),), proposed=4)
    text = explain_step(step, "ngram")
    assert "3 tokens" in text and "adaptive budget" in text


def test_plain_step_without_pruning_says_nothing_about_the_budget() -> None:
    step = Step(index=0, tree=DraftTree.root_only(5), tree_text=("a",), bonus=9,
                committed=(CommittedToken(9, "target", " b"),), proposed=1)
    assert "budget" not in explain_step(step, "ngram")
