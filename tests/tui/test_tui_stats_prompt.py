"""The stats panel's prompt row: how many prompt tokens, how many came from the cache, and the time
to the first token (what a long pasted prompt costs before the answer starts)."""

from __future__ import annotations

from textual.app import App, ComposeResult

from engine.events import Started, Step
from engine.tree import DraftTree
from specchat.tui.widgets.stats_panel import StatsView


class _Panel(App):
    def compose(self) -> ComposeResult:
        yield StatsView(id="stats")


async def test_the_prompt_row_shows_tokens_reuse_and_the_first_token_time() -> None:
    app = _Panel()
    async with app.run_test(size=(80, 20)) as pilot:
        stats = app.query_one(StatsView)
        stats.state.started(Started(prompt_tokens=1234, reused_tokens=0, prefill_ms=187.4))
        stats.state.add(Step(index=0, tree=DraftTree.root_only(5), proposed=1))
        stats.refresh()
        await pilot.pause()
        assert "1,234 tokens · first token 187 ms" in str(stats.render())
        # a later turn: most of the prompt is the conversation so far, already in the cache
        stats.state.reset_answer()
        stats.state.started(Started(prompt_tokens=1300, reused_tokens=1234, prefill_ms=21.0))
        stats.state.add(Step(index=0, tree=DraftTree.root_only(5), proposed=1))
        stats.refresh()
        await pilot.pause()
        assert "1,300 tokens, 1,234 reused · first token 21 ms" in str(stats.render())
