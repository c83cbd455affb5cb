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


def _paused_step(index: int) -> Step:
    return Step(index=index, tree=DraftTree.root_only(5), tree_text=("a",), bonus=9,
                committed=(CommittedToken(9, "target", " b"),), proposed=0, draft_paused=True)


def test_paused_drafting_is_explained() -> None:
    text = explain_step(_paused_step(4), "eagle3")
    assert "Drafting is paused" in text and "tries again" in text
    assert "had nothing to offer" not in text


async def test_stats_and_tree_panels_show_paused_drafting() -> None:
    from textual.app import App, ComposeResult
    from textual.widgets import Static

    from specchat.tui.widgets.draft_tree import DraftTreePanel, HistoryEntry
    from specchat.tui.widgets.stats_panel import StatsView

    class Panels(App):
        def compose(self) -> ComposeResult:
            yield StatsView(id="stats")
            yield DraftTreePanel(id="tree")

    app = Panels()
    async with app.run_test(size=(80, 30)) as pilot:
        stats = app.query_one(StatsView)
        for i in (1, 2, 3):
            stats.state.add(_paused_step(i) if i != 2 else Step(index=2, tree=DraftTree.root_only(5), proposed=1))
        stats.refresh()
        await pilot.pause()
        assert "drafting in 2/3 steps (now)" in str(stats.render())
        tree = app.query_one(DraftTreePanel)
        tree.add_steps([HistoryEntry("answer 1", "eagle3", _paused_step(3))])
        await pilot.pause()
        assert "drafting paused" in str(tree.query_one("#tree-title", Static).render())


def _stats_app():
    """An app holding the stats panel alone."""
    from textual.app import App, ComposeResult

    from specchat.tui.widgets.stats_panel import StatsView

    class Panel(App):
        def compose(self) -> ComposeResult:
            yield StatsView(id="stats")

    return Panel()


async def test_stats_panel_shows_when_the_budget_drafts_fewer_levels_than_set() -> None:
    from engine.events import Started
    from specchat.tui.widgets.stats_panel import StatsView

    app = _stats_app()
    async with app.run_test(size=(80, 20)) as pilot:
        stats = app.query_one(StatsView)
        stats.state.started(Started(prompt_tokens=4, config={"num_steps": 5}))
        chain = DraftTree.chain(5, [6, 7])
        stats.state.add(Step(index=1, tree=chain, proposed=3, draft_levels=5))
        stats.refresh()
        await pilot.pause()
        assert "levels" not in str(stats.render())  # all the levels that were set
        stats.state.add(Step(index=2, tree=DraftTree.chain(7, [8]), proposed=2, draft_levels=1))
        stats.state.add(_paused_step(3))  # a paused step keeps the last drafted step's levels
        stats.refresh()
        await pilot.pause()
        assert "1 of 5 (budget)" in str(stats.render())
        stats.state.config_in_force({"num_steps": 1})  # set to one level: nothing is cut
        stats.refresh()
        await pilot.pause()
        assert "levels" not in str(stats.render())
        stats.state.config_in_force({"num_steps": 5, "eagle_topk": 4})
        stats.state.add(Step(index=4, tree=DraftTree.chain(8, [9]), proposed=2, draft_levels=1, draft_width=1))
        stats.refresh()
        await pilot.pause()
        assert "1 of 5 · a chain, not top-k 4 (budget)" in str(stats.render())


async def test_stats_panel_says_how_much_the_corpus_drafted() -> None:
    from specchat.tui.widgets.stats_panel import StatsView

    app = _stats_app()
    async with app.run_test(size=(80, 20)) as pilot:
        stats = app.query_one(StatsView)
        stats.state.add(Step(index=1, tree=DraftTree.chain(5, [6, 7]), accepted=(1, 2), proposed=3))
        stats.refresh()
        await pilot.pause()
        assert "corpus" not in str(stats.render())  # conversation drafts only
        corpus = DraftTree((7, 8, 9), (-1, 0, 1), (1.0, 0.6, 0.4), source="corpus")
        stats.state.add(Step(index=2, tree=corpus, accepted=(1,), proposed=3))
        stats.refresh()
        await pilot.pause()
        assert "corpus   1/2 steps · 33% of kept drafts" in str(stats.render())


def test_a_step_drafted_from_the_corpus_says_so() -> None:
    corpus = DraftTree((7, 8, 9), (-1, 0, 1), (1.0, 0.6, 0.4), source="corpus")
    step = Step(index=5, tree=corpus, tree_text=("a", " b", " c"), accepted=(1,), bonus=4,
                committed=(CommittedToken(8, "draft", " b"), CommittedToken(4, "target", " d")), proposed=3)
    text = explain_step(step, "ngram")
    assert "past answers" in text and "copied from earlier text" not in text
    conversation = Step(index=6, tree=DraftTree.chain(7, [8]), tree_text=("a", " b"), accepted=(1,), bonus=4,
                        committed=(CommittedToken(8, "draft", " b"), CommittedToken(4, "target", " d")), proposed=2)
    assert "copied from earlier text" in explain_step(conversation, "ngram")


async def test_stats_panel_says_why_drafting_cannot_pay_here() -> None:
    """The budget's reckoning (engine/payoff.py) travels in each Step: a row with the reason while the
    drafter cannot pay, none once it pays (or before it was reckoned)."""
    from engine.events import DraftPayoff
    from specchat.tui.widgets.stats_panel import StatsView

    losing = DraftPayoff(draft_share=0.45, needed=0.49, depth=1, reached=0.31)
    app = _stats_app()
    async with app.run_test(size=(80, 20)) as pilot:
        stats = app.query_one(StatsView)
        stats.state.add(Step(index=1, tree=DraftTree.chain(5, [6]), proposed=2))
        stats.refresh()
        await pilot.pause()
        assert "payoff" not in str(stats.render())  # not reckoned yet
        stats.state.add(Step(index=2, tree=DraftTree.root_only(6), proposed=0, draft_paused=True, payoff=losing))
        stats.refresh()
        await pilot.pause()
        assert "payoff   can't pay: draft 45% · needs 49% · got 31%" in str(stats.render())
        hopeless = DraftPayoff(draft_share=1.44, needed=None, depth=0, reached=0.91)
        stats.state.add(Step(index=3, tree=DraftTree.root_only(6), proposed=0, draft_paused=True, payoff=hopeless))
        stats.refresh()
        await pilot.pause()
        assert "can't pay: draft 144% · no acceptance pays" in str(stats.render())
        paying = DraftPayoff(draft_share=0.1, needed=0.2, depth=2, reached=0.6)
        stats.state.add(Step(index=4, tree=DraftTree.chain(6, [7]), accepted=(1,), proposed=2, payoff=paying))
        stats.refresh()
        await pilot.pause()
        assert "payoff" not in str(stats.render())
