"""Compare any two methods (issue 21): choosing method A and method B (palette, --compare), the
one-line refusal that keeps the previous choice, the per-depth table, recording and replay, and
SVG snapshots of medusa vs eagle3 (scripted session, no model)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.config import ConfigError
from specchat.tui.compare_pair import pair_label, pair_methods, parse_pair
from specchat.tui.headless import (
    SIZE,
    make_app,
    make_session,
    replay_app,
    ui_settings,
    wait_idle,
    wait_loaded,
    wait_until,
)
from specchat.tui.screens.compare import CompareScreen, LaneResult, depth_table
from specchat.tui.screenshots import settled_screenshot
from specchat.tui.trace import UserTurn, read_trace
from tests.tui.helpers import palette, send

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("SPECCHAT_UPDATE_SNAPSHOTS") == "1"


# --- the choice, without a UI ------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "pair"), [
    ("medusa,eagle3", "medusa,eagle3"), ("medusa eagle3", "medusa,eagle3"), (" Medusa vs EAGLE3 ", "medusa,eagle3"),
    ("eagle3", "none,eagle3"), ("eagle3,none", "none,eagle3"), ("", ""), ("default", ""),
])
def test_a_pair_is_read_in_every_way_a_user_types_it(text: str, pair: str) -> None:
    assert parse_pair(text) == pair


@pytest.mark.parametrize(("text", "needle"), [
    ("medusa,medusa", "two different methods"), ("medusa,eagle9", "unknown method 'eagle9'"),
    ("a,b,c", "takes two methods"),
])
def test_a_bad_pair_is_refused_in_one_line(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as err:
        parse_pair(text)
    assert "\n" not in str(err.value)


def test_a_method_the_session_cannot_run_is_refused_with_what_it_has() -> None:
    with pytest.raises(ConfigError, match=r"medusa cannot run in this session .have: none, ngram, eagle3.*--draft"):
        parse_pair("medusa,eagle3", ("none", "ngram", "eagle3"))
    assert pair_methods("", "ngram") == ("none", "ngram") and pair_label("medusa,eagle3", "x") == "medusa vs eagle3"


def test_the_depth_table_puts_each_methods_acceptance_side_by_side() -> None:
    from engine.events import Finished, RunningStats, Started

    def done(method: str, depths: tuple[float, ...], tau: float) -> LaneResult:
        r = LaneResult().add(Started(prompt_tokens=3, config={"method": method}, drafter=method))
        return r.add(Finished(reason="stop", text="", tokens=9,
                              stats=RunningStats(tau=tau, accept_per_depth=depths)))

    table = depth_table([done("medusa", (0.71, 0.42, 0.2), 1.9), done("eagle3", (0.8, 0.66, 0.55, 0.43), 2.6)])
    lines = table.splitlines()
    assert lines[0].split() == ["accepted", "at", "depth", "d1", "d2", "d3", "d4", "tau"]
    assert lines[1].split() == ["medusa", "71%", "42%", "20%", "-", "1.90"]
    assert lines[2].split() == ["eagle3", "80%", "66%", "55%", "43%", "2.60"]
    assert depth_table([done("none", (), 1.0)]) == ""  # the baseline drafts nothing


# --- in the app --------------------------------------------------------------------------------------
async def run_compare(app, pilot, prompt: str = "compare this") -> CompareScreen:
    if not isinstance(app.screen, CompareScreen):
        await pilot.press("f3")
    await wait_until(pilot, lambda: isinstance(app.screen, CompareScreen), what="compare screen")
    await send(pilot, prompt, "#compare-prompt")
    await wait_idle(pilot)
    return app.compare_screen


async def test_the_palette_picks_method_a_and_method_b_and_both_run_against_the_baseline():
    session = make_session()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await palette(pilot, "compare medusa,eagle3", "Set compare = medusa,eagle3")
        await wait_until(pilot, lambda: app.ui.compare == "medusa,eagle3", what="chosen")
        screen = await run_compare(app, pilot)
        assert sorted(session.calls) == [("generate", "medusa"), ("generate", "none"), ("generate", "session")]
        a, b = screen.pane("baseline"), screen.pane("spec")
        assert (a.result.method, b.result.method, screen.plain.method) == ("medusa", "eagle3", "none")
        assert a.stream.plain_text == b.stream.plain_text != ""
        assert any(k == "draft" for _, k in a.stream.pieces) and any(k == "draft" for _, k in b.stream.pieces)
        assert screen.badge_text.startswith("✓ both identical to the baseline under greedy decoding")
        assert "medusa " in screen.badge_text and "eagle3 " in screen.badge_text and "vs baseline" in screen.badge_text
        table = screen.depth_text.splitlines()
        assert [line.split()[0] for line in table[1:]] == ["medusa", "eagle3"] and "d1" in table[0]
        assert screen.query_one("#depths").display
        assert "Method A · medusa" in str(a.query_one(".pane-title").render())
        # the settings in force are the session's, not a compared method's
        assert app.applied_config.method == "eagle3" and app.settings_control.current("compare") == "medusa,eagle3"
        # back to the default: the baseline against the method in force, no depth table
        assert app.apply_setting("compare", "default") is None
        screen = await run_compare(app, pilot, "again")
        assert screen.badge_text.startswith("✓ identical output") and not screen.query_one("#depths").display


async def test_a_choice_the_session_cannot_run_is_refused_and_the_previous_one_kept():
    session = make_session(refuse_methods={"medusa": "method 'medusa' needs a draft (--draft)"})
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        assert app.apply_setting("compare", "ngram,eagle3") is None
        refusal = app.apply_setting("compare", "medusa,eagle3")
        assert refusal is not None and "medusa cannot run in this session" in refusal and "\n" not in refusal
        assert app.ui.compare == "ngram,eagle3"
        screen = await run_compare(app, pilot)
        assert (screen.pane("baseline").result.method, screen.pane("spec").result.method) == ("ngram", "eagle3")
        assert ("generate", "medusa") not in session.calls


async def test_a_refused_compare_flag_falls_back_to_the_baseline_once_loaded():
    session = make_session(refuse_methods={"medusa": "no Medusa head"})
    app = make_app(session, ui=ui_settings(compare="medusa,eagle3"), start_in="compare")
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await wait_until(pilot, lambda: app.ui.compare == "", what="fallback")
        await send(pilot, "x", "#compare-prompt")
        await wait_idle(pilot)
        assert app.compare_screen.badge_text.startswith("✓ identical output")


async def test_the_chosen_methods_are_named_before_the_first_run():
    app = make_app(make_session(), ui=ui_settings(compare="ngram,eagle3"), start_in="compare")
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        screen = app.compare_screen
        await wait_until(pilot, lambda: screen.ready, what="compare screen")
        assert "ngram, eagle3 and the baseline" in str(screen.query_one("#compare-question").render())
        assert "Method A" in str(screen.pane("baseline").query_one(".pane-title").render())
        assert app.apply_setting("compare", "default") is None
        assert "Baseline (no drafter)" in str(screen.pane("baseline").query_one(".pane-title").render())


async def test_a_two_method_compare_is_recorded_and_replays_into_the_same_panes(tmp_path):
    path = tmp_path / "rec.jsonl"
    session = make_session()
    live = make_app(session, record=str(path), ui=ui_settings(compare="ngram,eagle3"))
    async with live.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        for prompt in ("one", "two"):  # the second runs in another order
            screen = await run_compare(live, pilot, prompt)
        shown = (screen.pane("baseline").stream.pieces, screen.pane("spec").stream.pieces, screen.depth_text)
        badge = screen.badge_text
    turns = [r for r in read_trace(path)[1] if isinstance(r, UserTurn)]
    assert [t.methods for t in turns] == [("ngram", "eagle3")] * 2
    replay = replay_app(path)
    async with replay.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        screen = replay.compare_screen
        assert (screen.pane("baseline").stream.pieces, screen.pane("spec").stream.pieces,
                screen.depth_text) == shown
        assert screen.badge_text.split(" · ")[0] == badge.split(" · ")[0]


# --- snapshots ---------------------------------------------------------------------------------------
async def scenario_two(size: tuple[int, int]) -> str:
    """medusa vs eagle3 on one prompt, the scripted session's recorded timings."""
    app = make_app(make_session(), ui=ui_settings(compare="medusa,eagle3", save_sessions=False), start_in="compare")
    async with app.run_test(size=size) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "What is speculative decoding?", "#compare-prompt")
        await wait_idle(pilot)
        return await settled_screenshot(pilot, "specchat · compare two methods")


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_snapshot_compare_medusa_vs_eagle3(tmp_path, size):
    name = f"compare-two-{size[0]}x{size[1]}"
    svg = await scenario_two(size)
    baseline = SNAPSHOTS / f"{name}.svg"
    if UPDATE:
        baseline.write_text(svg, encoding="utf-8")
        return
    if baseline.read_text(encoding="utf-8") != svg:
        (tmp_path / f"{name}.actual.svg").write_text(svg, encoding="utf-8")
        pytest.fail(f"{name}: the screen changed; compare {baseline} with {tmp_path / name}.actual.svg "
                    "(SPECCHAT_UPDATE_SNAPSHOTS=1 accepts the new look)")


# --- Medusa like every other method ------------------------------------------------------------------
async def test_medusa_in_the_tree_panel_stats_teaching_settings_and_replay(tmp_path):
    from specchat.tui.headless import CONFIG

    path = tmp_path / "medusa.jsonl"
    session = make_session(config=CONFIG.replace(method="medusa"))
    app = make_app(session, teach=True, record=str(path))
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "teach me")
        await wait_until(pilot, lambda: app.gate_waiting)
        for _ in range(3):
            n = len(app.chat_screen.tree.history)
            await pilot.press("f8")
            await wait_until(pilot, lambda n=n: len(app.chat_screen.tree.history) == n + 1 and app.gate_waiting)
        entry = app.chat_screen.tree.current
        assert entry.method == "medusa" and entry.step.tree.has_probs
        teach = str(app.chat_screen.query_one("#teach").render())
        assert "The medusa drafter proposed" in teach and "independent heads" in teach
        assert "product of their top-k" in teach and "deeper heads miss more" in teach
        tree = str(app.chat_screen.tree.view.render())
        assert any(f"{p:.2f}" in tree for p in entry.step.tree.draft_probs[1:])  # the heads' probabilities
        assert "acceptance per depth" in str(app.chat_screen.stats.render())
        assert "medusa" in str(app.chat_screen.query_one("#title").render())
        # the Medusa knob acts on medusa only
        assert app.apply_setting("medusa_tree", "static") is None
        assert app.settings_control.in_force.medusa_tree == "static"
        await pilot.press("f4")
        await wait_idle(pilot)
        assert app.apply_setting("method", "ngram") is None
        refusal = app.apply_setting("medusa_tree", "dynamic")
        assert refusal is not None and "not used by ngram" in refusal
        live = [e.step for e in app.chat_screen.tree.history]
    replay = replay_app(path)
    async with replay.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        assert [e.step for e in replay.chat_screen.tree.history] == live
        assert {e.method for e in replay.chat_screen.tree.history} == {"medusa"}


def test_the_compare_flag_opens_the_view_and_is_checked_before_anything_loads():
    from specchat.tui.launch import preflight
    from tests.parsed import parsed

    assert parsed("run", "--compare").compare == ""  # the baseline vs the method in force
    options = parsed("run", "--fake", "--compare", "medusa,eagle3")
    preflight(options)
    assert options.also_runs() == ("medusa", "eagle3")  # the loader installs the heads shipped for them
    assert parsed("bench", "--methods", "none,ngram,medusa,eagle3").also_runs() == (
        "none", "ngram", "medusa", "eagle3")
    with pytest.raises(ConfigError, match="two different methods"):
        preflight(parsed("run", "--fake", "--compare", "medusa,medusa"))
