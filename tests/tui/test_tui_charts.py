"""The charts view (F9): what it plots (computed from step events), how it opens, fills while an
answer streams, and closes, and how it looks (SVG snapshots at 80x24 and 120x40 in each theme)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.costs import CostModel
from engine.events import CommittedToken, Finished, Started, Step, StepTiming
from engine.tree import DraftTree
from specchat.tui import headless, screenshots
from specchat.tui.chart_data import ChartData
from specchat.tui.keys import APP_KEYS
from specchat.tui.screens.charts import EMPTY_TEXT, ChartsScreen
from specchat.tui.scripted import ScriptedSession
from tests.tui.test_tui_snapshots import SIZES, THEMES, check

# root -> a -> b -> c (a chain of three drafts) plus x, a second child of the root
CHAIN = DraftTree((10, 11, 12, 13, 14), (-1, 0, 1, 2, 0), (1.0,) * 5)


def step(index: int, accepted: tuple[int, ...], *, tree: DraftTree = CHAIN, verify_ms: float = 10.0,
         proposed: int = 0) -> Step:
    drafts = tuple(CommittedToken(tree.tokens[i], "draft", "d") for i in accepted)
    return Step(index=index, tree=tree, accepted=accepted, committed=(*drafts, CommittedToken(99, "target", "t")),
                timing=StepTiming(verify_ms=verify_ms), proposed=proposed)


def started(method: str = "eagle3") -> Started:
    return Started(config={"method": method})


def test_acceptance_by_depth_per_answer_and_session():
    data = ChartData()
    data.add("chat", started())
    data.add("chat", step(0, (), tree=DraftTree.root_only(10)))  # the prefill's token: no tree
    data.add("chat", step(1, (1, 2)))  # depth 1 and 2 kept, depth 3 refused
    data.add("chat", step(2, ()))  # depth 1 refused: deeper depths were not attempted
    answer1 = data.view().answer_depth
    assert [(r.depth, r.accepted, r.attempts) for r in answer1] == [(1, 1, 2), (2, 1, 1), (3, 0, 1)]
    data.add("chat", Finished())
    data.add("chat", started())
    data.add("chat", step(1, (1, 2, 3)))  # the whole chain kept
    view = data.view()
    assert [(r.depth, r.accepted, r.attempts) for r in view.answer_depth] == [(1, 1, 1), (2, 1, 1), (3, 1, 1)]
    assert [(r.depth, r.accepted, r.attempts) for r in view.session_depth] == [(1, 2, 3), (2, 2, 2), (3, 1, 2)]
    assert view.session_depth[0].rate == pytest.approx(2 / 3)
    assert view.answers == 2
    assert view.committed == ((3, 1),)  # the second answer's only step: three drafts, one target token


def test_compare_lanes_charted_except_the_baseline():
    data = ChartData()
    data.add("baseline", started("none"))
    data.add("baseline", step(1, (1,)))
    assert data.view().empty and data.version == 0
    data.add("alt", started("ngram"))  # method A of a two-method compare
    data.add("alt", step(1, (1,)))
    data.add("spec", started("eagle3"))  # method B
    data.add("spec", step(1, (1, 2)))
    view = data.view()
    assert view.answers == 2 and view.method == "eagle3"
    assert [(r.accepted, r.attempts) for r in view.session_depth] == [(2, 2), (1, 2), (0, 1)]


def test_cost_curve_is_the_budgets_own_and_skips_the_prefill_step():
    """Fed the same (size, verify ms) the session feeds its budget, the drawn curve is the budget's
    CostModel: the prefill's step 0 (no verify) is left out, methods are kept apart."""
    data = ChartData()
    data.add("chat", started("ngram"))
    data.add("chat", step(0, (), tree=DraftTree.root_only(10), verify_ms=500.0))
    data.add("chat", step(1, (1,), verify_ms=10.0, proposed=9))
    data.add("chat", step(2, (), tree=DraftTree.root_only(10), verify_ms=6.0))
    data.add("chat", step(3, (1,), verify_ms=14.0, proposed=9))
    model = CostModel()
    for n, ms in ((5, 10.0), (1, 6.0), (5, 14.0)):
        model.observe(n, ms)
    view = data.view()
    assert dict(view.cost_measured) == pytest.approx(model.ms)
    assert [n for n, _ in view.cost_curve] == list(range(1, 10))  # up to the largest size proposed
    assert dict(view.cost_curve)[7] == pytest.approx(model.estimate(7))
    assert [(c.proposed, c.kept) for c in view.cuts] == [(9, 5), (0, 1), (9, 5)]
    data.add("chat", started("eagle3"))  # another method: its own (empty) cost model
    assert data.view().cost_curve == ()


def test_cost_curve_follows_the_calibrated_shape():
    """A session that calibrated its cost shape says so in Started; the drawn curve then scales the
    measured shape like the budget does, not a line through the few sizes seen."""
    shape = ((1, 1.0), (4, 1.2), (16, 3.0))
    data = ChartData()
    data.add("chat", Started(config={"method": "ngram"}, cost_shape=shape))
    data.add("chat", step(1, (1,), verify_ms=10.0, proposed=16))  # a 5-node tree
    budget = CostModel(shape=dict(shape))
    budget.observe(5, 10.0)
    curve = dict(data.view().cost_curve)
    assert curve[16] == pytest.approx(budget.estimate(16))
    assert curve[16] == pytest.approx(10.0 * 3.0 / budget.relative(5))  # along the shape, from size 5


def test_started_cost_shape_survives_a_trace():
    import json

    from engine.events import event_from_dict, event_to_dict

    ev = Started(config={"method": "ngram"}, cost_shape=((1, 1.0), (8, 1.5)))
    assert event_from_dict(json.loads(json.dumps(event_to_dict(ev)))) == ev


def test_charts_key_is_in_the_keymap_and_palette():
    from specchat.tui.commands import SYSTEM_COMMANDS

    spec = next(k for k in APP_KEYS if k.id == "charts")
    assert spec.action == "toggle_charts" and spec.show
    assert any(action == "toggle_charts" for _, _, action in SYSTEM_COMMANDS)


async def test_charts_open_empty_fill_live_and_close():
    gate = threading.Event()
    session = ScriptedSession(screenshots.cut_answers(), config=headless.CONFIG, step_delay=0.0)
    original = session._sleep

    def slow_after_five(ev: Step) -> None:  # hold the answer after a few steps: the view must be live
        if ev.index == 5:
            gate.wait(10)
        original(ev)

    session._sleep = slow_after_five  # type: ignore[method-assign]
    app = headless.make_app(session, ui=headless.ui_settings(save_sessions=False))
    async with app.run_test(size=(80, 24)) as pilot:
        await headless.wait_loaded(pilot)
        await pilot.press("f9")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ChartsScreen)
        assert screen.has_class("-empty")
        assert screen.query_one("#charts-empty").display and not screen.query_one("#charts-body").display
        assert "No answer yet" in EMPTY_TEXT
        app.submit_prompt("What is speculative decoding?")
        await headless.wait_until(pilot, lambda: len(app.charts.view().committed) == 5, what="five steps")
        await headless.wait_until(pilot, lambda: screen.drawn == app.charts.version, what="live redraw")
        assert not screen.has_class("-empty") and app.busy_job is not None  # drawn while still streaming
        assert len(screen.query_one("#chart-steps").view.committed) == 5
        gate.set()
        await headless.wait_idle(pilot)
        await headless.wait_until(pilot, lambda: screen.drawn == app.charts.version, what="final redraw")
        assert not app.charts.view().streaming
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.chat_screen
        await pilot.press("f9")
        await pilot.pause()
        assert isinstance(app.screen, ChartsScreen) and not app.screen.has_class("-empty")
        await pilot.press("f9")
        await pilot.pause()
        assert app.screen is app.chat_screen


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES)
async def test_snapshot_charts(tmp_path: Path, size: str, theme: str):
    check(f"charts-{size}-{theme}", await screenshots.scenario_charts(size=SIZES[size], theme=theme), tmp_path)
