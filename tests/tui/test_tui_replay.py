"""Pilot tests of replaying a recorded trace: the same screen as the live answer, its pacing and
speed keys, a compare turn, and the launcher's one-line refusals (no model)."""

from __future__ import annotations

import time
from pathlib import Path

from engine.events import Step
from specchat.tui.headless import SIZE, make_app, make_session, replay_app, wait_idle, wait_loaded, wait_until
from specchat.tui.screens.compare import CompareScreen
from specchat.tui.trace import read_trace
from specchat.tui.widgets.transcript import AnswerView, UserTurnView
from tests.tui.helpers import send

TRACE = Path(__file__).parent / "fixtures" / "demo.jsonl"


async def test_replay_reproduces_a_recording(tmp_path):
    path = tmp_path / "rec.jsonl"
    session = make_session()
    live = make_app(session, record=str(path))
    async with live.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "first")
        await wait_idle(pilot)
        await send(pilot, "second")
        await wait_idle(pilot)
        live_text = [a.stream.pieces for a in live.chat_screen.query(AnswerView)]
        live_turns = [u.text for u in live.chat_screen.query(UserTurnView)]
        live_tree = [e.step for e in live.chat_screen.tree.history]
    header, _ = read_trace(path)
    assert header["model"] == "fake-model"

    replay = replay_app(path)
    async with replay.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        assert [a.stream.pieces for a in replay.chat_screen.query(AnswerView)] == live_text
        assert [u.text for u in replay.chat_screen.query(UserTurnView)] == live_turns
        assert [e.step for e in replay.chat_screen.tree.history] == live_tree
        assert "REPLAY" in str(replay.chat_screen.query_one("#title").render())
        assert replay.chat_screen.prompt.disabled
        assert replay.submit_prompt("x") is False, "no model in a replay"


async def test_replay_of_fixture_switches_to_compare_for_a_compare_turn():
    app = replay_app(TRACE)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        assert isinstance(app.screen, CompareScreen)
        assert app.compare_screen.badge_text.startswith("✓ identical")
        assert len(list(app.chat_screen.query(AnswerView))) == 2
        # the recorded hot swap shows as applied settings
        assert app.applied_config.num_steps == 3 and app.pending_config is None


async def test_replay_keeps_the_original_pacing_scaled_by_speed():
    _, records = read_trace(TRACE)
    first = records[: next(i for i, r in enumerate(records) if r.kind == "finished") + 1]
    recorded_s = sum(r.timing.total_ms for r in first if isinstance(r, Step)) / 1000
    recorded_s += next(r for r in first if r.kind == "started").prefill_ms / 1000
    app = replay_app(TRACE, first, speed=0.5)
    t0 = time.perf_counter()
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        took = time.perf_counter() - t0
    expected = recorded_s / 0.5
    assert expected * 0.9 < took < expected + 3.0  # + start-up of the app


async def test_replay_step_through_and_speed_keys():
    app = replay_app(TRACE, step=True, speed=1.0)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await wait_until(pilot, lambda: app.gate_waiting, what="first step")
        assert len(app.chat_screen.tree.history) == 1
        await pilot.press("f8")
        await wait_until(pilot, lambda: len(app.chat_screen.tree.history) == 2 and app.gate_waiting)
        assert "Teaching" in str(app.chat_screen.query_one("#teach").render())
        await pilot.press("plus")
        assert app.host.replay_speed == 2.0
        await pilot.press("minus")
        await pilot.press("minus")
        assert app.host.replay_speed == 0.5
        await pilot.press("f4")  # leave step-through: plays on (fast)
        app.host.replay_speed = 0
        await wait_idle(pilot)


def test_replay_tui_refuses_a_bad_trace_in_one_line(tmp_path, capsys):
    import argparse

    from specchat.tui.launch import replay_tui

    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    assert replay_tui(argparse.Namespace(trace=str(bad), speed=1.0, step=False, theme=None)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specchat replay:") and "bad.jsonl: no whole JSON record in it, not a specchat trace" in err
    assert "\n" not in err


def test_replay_tui_plays_a_recording_cut_by_a_crash_and_says_so(tmp_path, monkeypatch):
    import argparse

    from specchat.tui import launch
    from specchat.tui.app import SpecChatApp

    cut = tmp_path / "cut.jsonl"
    cut.write_text(TRACE.read_text(encoding="utf-8") + '{"kind": "step", "index": 3, "tr', encoding="utf-8")
    seen: dict = {}

    def fake_run(app: SpecChatApp) -> int:
        seen["warnings"], seen["records"] = list(app._warnings), len(app.replay.records)
        return 0

    monkeypatch.setattr(SpecChatApp, "run", fake_run)
    assert launch.replay_tui(argparse.Namespace(trace=str(cut), speed=1.0, step=False, theme=None)) == 0
    assert any("1 damaged line(s) left out" in w for w in seen["warnings"])
    assert seen["records"] == len(read_trace(TRACE)[1])
