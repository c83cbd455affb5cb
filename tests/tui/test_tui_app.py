"""Pilot tests of the app, driven by a scripted session or the recorded fixture trace (no model)."""

from __future__ import annotations

import time
from pathlib import Path

from engine.config import ConfigError
from engine.events import Step
from specchat.tui.app import SpecChatApp
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
from specchat.tui.screens.compare import CompareScreen
from specchat.tui.screens.help import HelpScreen
from specchat.tui.trace import UserTurn, read_trace
from specchat.tui.widgets.draft_tree import DraftTreeView
from specchat.tui.widgets.transcript import AnswerView, UserTurnView
from tests.tui.helpers import send

TRACE = Path(__file__).parent / "fixtures" / "demo.jsonl"


def segments(widget, lines: int = 3) -> list[tuple[str, object]]:
    out = []
    for y in range(lines):
        out += [(seg.text, seg.style) for seg in widget.render_line(y) if seg.text.strip()]
    return out


# --- streaming and token styles -------------------------------------------------------------------
async def test_tokens_are_styled_by_origin_with_non_colour_cues():
    session = make_session()
    app = make_app(session, ui=ui_settings(show_rejected=True))
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "What is speculative decoding?")
        await wait_idle(pilot)
        answer = app.chat_screen.answer
        stream = answer.stream
        steps = [ev for ev in session._answers[0] if isinstance(ev, Step)]
        # every committed token is in the stream, with its origin; refused drafts just before the bonus
        expected = []
        for s in steps:
            for c in s.committed:
                if c.origin == "target" and s.rejected:
                    expected.append(("|".join(s.tree_text[i] for i in s.rejected), "rejected"))
                if c.text:
                    expected.append((c.text, c.origin))
        assert stream.pieces == expected
        assert stream.plain_text == "".join(s.text for s in steps)
        assert stream.token_count == sum(len(s.committed) for s in steps)

        draft = stream.get_visual_style("token--draft", partial=True)
        target = stream.get_visual_style("token--target", partial=True)
        rejected = stream.get_visual_style("token--rejected", partial=True)
        assert draft.underline and not draft.bold
        assert target.bold and not target.underline
        assert rejected.strike
        assert len({draft.foreground, target.foreground, rejected.foreground}) == 3
        # the terminal output carries those styles
        rendered = segments(stream, 4)
        assert any(style.underline for _, style in rendered)
        assert any(style.bold for _, style in rendered)
        assert any(style.strike for _, style in rendered)

        # "show rejected" off: the refused drafts disappear from what is on screen, not from the data
        await pilot.press("f5")
        await pilot.pause()
        assert stream.show_rejected is False
        assert not any(style.strike for _, style in segments(stream, 4))
        assert str(stream.build_content()) == stream.plain_text
        assert "tau" in str(answer.meta.render())
        assert [type(w) for w in app.chat_screen.transcript.children] == [UserTurnView, AnswerView]


async def test_theme_switch_recolours_what_is_already_on_screen():
    app = replay_app(TRACE, read_trace(TRACE)[1][:12])
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        stream = app.chat_screen.answer.stream
        tree = app.chat_screen.query_one(DraftTreeView)
        before = segments(stream), segments(tree, 6)
        dark = app.current_theme.variables["tok-draft"]
        assert any(str(st.color.name).lower() == dark.lower() for _, st in before[0] if st.underline)

        app.apply_setting("theme", "light")
        await pilot.pause()
        assert app.theme == "specchat-light"
        after = segments(stream), segments(tree, 6)
        light = app.current_theme.variables["tok-draft"]
        assert [t for t, _ in after[0]] == [t for t, _ in before[0]], "same text"
        assert any(str(st.color.name).lower() == light.lower() for _, st in after[0] if st.underline)
        assert all(a[1] != b[1] for a, b in zip(before[0], after[0], strict=True)), "every token recoloured"
        assert before[1] != after[1], "the tree recoloured too"

        app.apply_setting("theme", "colourblind")
        await pilot.pause()
        cb = segments(stream)
        assert any(str(st.color.name).lower() == "#56b4e9" for _, st in cb if st.underline)


# --- the draft tree --------------------------------------------------------------------------------
async def test_tree_shows_nodes_accepted_path_and_browses_steps():
    _, records = read_trace(TRACE)
    first_answer = records[: next(i for i, r in enumerate(records) if r.kind == "finished") + 1]
    steps = [r for r in first_answer if isinstance(r, Step)]
    app = replay_app(TRACE, first_answer)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        panel = app.chat_screen.tree
        view = panel.view
        last = steps[-1]
        assert view.step == last and panel.live
        # find a branching step with an accepted path and refused drafts, and browse to it
        target = next(i for i, s in enumerate(steps) if s.accepted_len >= 2 and s.rejected and not s.tree.is_chain)
        panel.focus()
        for _ in range(len(steps) - 1 - target):
            await pilot.press("left")
        step = steps[target]
        assert view.step == step and not panel.live
        title = str(panel.query_one("#tree-title").render())
        assert f"{len(steps) - 1 - target} steps back" in title and "End: live" in title
        assert f"step {step.index} ·" in title

        lines = view.lines
        assert len(lines) == len(step.tree) + 1, "one line per node, plus the bonus"
        assert lines[0].startswith("◆")
        accepted_lines = [line for line in lines if "✓" in line]
        assert len(accepted_lines) == step.accepted_len
        for i, line in zip(step.accepted, accepted_lines, strict=True):
            assert step.tree_text[i].replace(" ", "·") in line
            assert f"{step.tree.draft_probs[i]:.2f}" in line
        assert sum("✗" in line for line in lines) == len(step.rejected)
        assert sum("★" in line for line in lines) == 1
        assert view.states[0] == "root"
        assert {i for i, s in view.states.items() if s == "accepted"} == set(step.accepted)
        assert {i for i, s in view.states.items() if s == "rejected"} == set(step.rejected)
        # the accepted path is highlighted: its segments carry the accepted style, others are grey
        # (a colour that still reads at 4.5:1, not the terminal's dim attribute)
        acc_style = view.get_visual_style("tree--accepted", partial=True)
        unr_style = view.get_visual_style("tree--unreached", partial=True)
        assert acc_style.bold and acc_style.background is not None and not unr_style.bold
        assert unr_style.foreground != acc_style.foreground

        await pilot.press("right")
        assert view.step == steps[target + 1]
        await pilot.press("end")
        assert panel.live and view.step == last


async def test_whitespace_and_control_characters_are_visible_in_the_tree():
    from specchat.tui.token_text import visible

    assert visible(" the") == "·the"
    assert visible("\n") == "↵" and visible("\t") == "→" and visible("") == "∅"
    assert visible("\x1b[31m") == "\\x1b[31m"
    assert visible("x" * 40).endswith("…")


# --- settings: pending then applied, refused values ----------------------------------------------
async def test_setting_changed_mid_answer_is_pending_then_applied():
    session = make_session()
    app = make_app(session, teach=True)  # teaching mode pauses at step boundaries: "mid-answer"
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "explain")
        await wait_until(pilot, lambda: app.gate_waiting, what="engine paused after a step")
        await pilot.press("f2")
        await pilot.pause()
        panel = app.chat_screen.settings
        field = panel.query_one("#set-num_steps")
        assert field.has_focus and field.value == "5"
        field.value = "3"
        await pilot.press("enter")
        await pilot.pause()
        assert app.pending_config is not None and app.pending_config.num_steps == 3
        assert app.applied_config.num_steps == 5
        assert session.pending_config == app.pending_config
        assert "pending" in str(panel.query_one("#status-num_steps").render())
        title = str(app.chat_screen.query_one("#title").render())
        assert "pending: num_steps 5→3" in title

        await pilot.press("f8")  # one more step: the change takes effect at this boundary
        await wait_until(pilot, lambda: app.pending_config is None, what="applied")
        assert app.applied_config.num_steps == 3
        assert "pending" not in str(panel.query_one("#status-num_steps").render())
        assert "steps 3" in str(app.chat_screen.query_one("#title").render())
        assert any(k == "marker" for _, k in app.chat_screen.answer.stream.pieces), "where it applied"
        await pilot.press("f4")  # leave teaching mode, the answer runs out
        await wait_idle(pilot)


async def test_idle_setting_change_applies_at_once_via_command_palette_path():
    session = make_session()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        assert app.apply_setting("topk", "2") is None  # short names, as typed in the palette
        assert app.apply_setting("warp_speed", "9") == "unknown setting 'warp_speed'"
        assert app.pending_config is None and app.applied_config.eagle_topk == 2
        assert session.config.eagle_topk == 2


async def test_invalid_settings_are_refused_and_the_old_value_stays():
    session = make_session(refuse_methods={"standalone": "method 'standalone' is not available in this session"})
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await pilot.press("f2")
        await pilot.pause()
        panel = app.chat_screen.settings
        before = app.applied_config
        field = panel.query_one("#set-num_steps")
        field.value = "0"
        await pilot.press("enter")
        await pilot.pause()
        status = str(panel.query_one("#status-num_steps").render())
        assert "refused" in status
        assert "num_steps must be an integer from 1 to 32 (--speculative-num-steps), got 0" in status
        assert field.value == "5", "the field shows the value in force again"
        assert app.applied_config == before and app.pending_config is None
        assert session.config == before

        field.value = "lots"
        await pilot.press("enter")
        await pilot.pause()
        assert "must be an integer, got 'lots'" in str(panel.query_one("#status-num_steps").render())

        # a knob of another drafter does nothing here: refused, with the reason
        assert "not used by eagle3; acts on ngram" in app.apply_setting("ngram_max_match_window_size", "0")
        # a method the session cannot build (e.g. without its draft model) is neither offered nor taken
        msg = app.apply_setting("method", "standalone")
        assert "cannot run in this session" in msg and "--draft" in msg
        assert panel.query_one("#set-method").value == "eagle3"
        assert app.applied_config == before and session.config == before

        # a good value clears the error
        field.value = "4"
        await pilot.press("enter")
        await pilot.pause()
        assert app.applied_config.num_steps == 4
        assert "refused" not in str(panel.query_one("#status-num_steps").render())


async def test_settings_schema_parsing():
    import pytest

    from specchat.tui.settings_schema import FIELDS, parse_value, resolve_name

    assert parse_value(FIELDS["temperature"], "0.7") == 0.7
    assert parse_value(FIELDS["show_rejected"], "off") is False
    assert resolve_name("topk") == "eagle_topk" and resolve_name("steps") == "num_steps"
    assert resolve_name("bogus") is None
    with pytest.raises(ConfigError, match="one of"):
        parse_value(FIELDS["method"], "lookahead")


# --- cancel ----------------------------------------------------------------------------------------
async def test_escape_cancels_and_the_conversation_stays_usable():
    session = make_session(step_delay=0.15)  # slow steps: Pilot's key presses wait for an idle CPU
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "a long answer please")
        await wait_until(pilot, lambda: app.chat_screen.answer is not None
                         and app.chat_screen.answer.steps >= 2, what="a few steps")
        await pilot.press("escape")
        await wait_idle(pilot)
        first = app.chat_screen.answer
        assert first.finished is not None and first.finished.reason == "cancelled"
        assert first.has_class("-cancelled") and "CANCELLED" in str(first.meta.render())
        total = len([e for e in session._answers[0] if isinstance(e, Step)])
        assert first.steps < total
        # the partial answer is kept in the conversation, and the next prompt works
        assert session.messages[-1]["role"] == "assistant"
        assert session.messages[-1]["content"] == first.stream.plain_text
        session.step_delay = 0.0
        await send(pilot, "and now?")
        await wait_idle(pilot)
        second = app.chat_screen.answer
        assert second is not first and second.finished.reason == "stop"
        assert len(session.messages) == 4


# --- compare ---------------------------------------------------------------------------------------
async def test_compare_mode_shows_both_panes_and_the_identical_badge():
    session = make_session()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await pilot.press("f3")
        await wait_until(pilot, lambda: isinstance(app.screen, CompareScreen), what="compare screen")
        await send(pilot, "compare this", "#compare-prompt")
        await wait_idle(pilot)
        screen = app.compare_screen
        base, spec = screen.pane("baseline"), screen.pane("spec")
        assert base.stream.plain_text == spec.stream.plain_text != ""
        assert all(k == "target" for _, k in base.stream.pieces), "baseline: target tokens only"
        assert any(k == "draft" for _, k in spec.stream.pieces)
        assert screen.badge_text.startswith("✓ identical output under greedy decoding")
        assert "speed-up" in screen.badge_text
        assert screen.query_one("#badge").has_class("-identical")
        assert session.calls == [("generate", "none"), ("generate", "session")]
        # the measured baseline feeds the stats panel's speed-up
        assert app.baseline_tps == base.result.finished.stats.tokens_per_s
        assert app.chat_screen.stats.state.baseline_tps == app.baseline_tps


async def test_compare_badge_shows_the_first_difference():
    from specchat.tui.headless import CONFIG
    from specchat.tui.scripted import baseline_answer, synthetic_answer

    spec = synthetic_answer("The cat sat on the mat.", config=CONFIG)
    other = baseline_answer(synthetic_answer("The cat sat on a mat.", config=CONFIG))
    screen_app = make_app(make_session())
    async with screen_app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        screen = screen_app.compare_screen
        screen_app.switch_screen("compare")
        await pilot.pause()
        screen.show_records("spec", [UserTurn(text="q", mode="compare")])
        screen.show_records("baseline", other)
        screen.show_records("spec", spec)
        assert screen.badge_text.startswith("≠ first difference at token 4 (char 14)")
        assert "‹·a›" in screen.badge_text and "‹·the›" in screen.badge_text
        assert screen.query_one("#badge").has_class("-different")


# --- teaching ---------------------------------------------------------------------------------------
async def test_teaching_mode_explains_each_step_in_plain_words():
    session = make_session()
    app = make_app(session, teach=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        assert app.chat_screen.has_class("-teaching")
        await send(pilot, "teach me")
        await wait_until(pilot, lambda: app.gate_waiting)
        for _ in range(3):
            n = len(app.chat_screen.tree.history)
            await pilot.press("f8")
            await wait_until(pilot, lambda n=n: len(app.chat_screen.tree.history) == n + 1 and app.gate_waiting)
        teach = str(app.chat_screen.query_one("#teach").render())
        step = app.chat_screen.tree.current.step
        assert f"Step {step.index}." in teach
        assert f"{step.tree.num_drafts} tokens over {step.tree.max_depth} level" in teach
        assert f"{len(step.committed)} token" in teach and "one target forward" in teach
        assert "paused" in teach
        await pilot.press("f7")  # previous step: browsing, the explanation follows
        assert f"Step {step.index - 1}." in str(app.chat_screen.query_one("#teach").render())
        await pilot.press("f8")
        assert app.chat_screen.tree.live
        await pilot.press("f4")
        await wait_idle(pilot)


async def test_explain_step_words():
    from specchat.tui.teaching import explain_step

    _, records = read_trace(TRACE)
    steps = [r for r in records if isinstance(r, Step)]
    prefill = steps[0]
    text = explain_step(prefill, "eagle3", prompt_tokens=24)
    assert text.startswith("Prefill.") and "24 tokens of the prompt" in text and "one-off cost" in text
    s = next(s for s in steps if s.accepted_len >= 2 and s.rejected)
    text = explain_step(s, "eagle3")
    assert f"proposed a tree of {s.tree.num_drafts} tokens over {s.tree.max_depth} levels" in text
    assert f"accepted {s.accepted_len} drafted tokens" in text and "(a correction)" in text
    assert "bonus" not in text
    assert f"Result: {len(s.committed)} tokens for one target forward" in text


async def test_help_screen_explains_the_words_and_the_knobs():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await pilot.press("f1")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = app.screen.query_one("#help-text").source
        for word in ("Draft", "Verify", "Accept", "Bonus", "tau", "num_steps", "eagle_topk", "num_draft_tokens"):
            assert word in text
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen))


# --- the engine thread never waits on the UI ---------------------------------------------------------
async def test_engine_thread_never_waits_on_a_slow_ui(monkeypatch):
    """No yield of the session waits for a UI batch (each takes 100 ms here), and the answer takes as
    long as it does with no UI at all. (Yields may still wait a few ms for the GIL while the UI
    thread renders: that is CPU sharing, not waiting on the UI.)"""
    import threading

    from specchat.tui.host import EngineHost, wait_items
    from specchat.tui.host_api import ChatJob, JobDone

    # without a UI
    alone = make_session(step_delay=0.004)
    host = EngineHost(lambda p: alone, wake=lambda: None)
    thread = threading.Thread(target=host.run, daemon=True)
    thread.start()
    job = host.submit(ChatJob("x"))
    wait_items(host, lambda items: any(isinstance(i, JobDone) and i.job == job for i in items))
    no_ui_s = alone.runs[-1]
    host.shutdown()
    thread.join(5)

    # with a deliberately slow UI
    session = make_session(step_delay=0.004)
    app = make_app(session)
    slow_batches = []
    original = SpecChatApp._process

    def slow_process(self, items):
        if any(getattr(i, "lane", None) for i in items):
            slow_batches.append(len(items))
            time.sleep(0.1)  # blocks the UI thread's event loop
        original(self, items)

    monkeypatch.setattr(SpecChatApp, "_process", slow_process)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        session.yield_gaps.clear()
        await send(pilot, "x")
        await wait_idle(pilot)
        engine_s = session.runs[-1]
        steps = len([e for e in session._answers[0] if isinstance(e, Step)])
        assert len(session.yield_gaps) >= steps
        gaps = sorted(session.yield_gaps)
        assert gaps[-1] < 0.1, f"a yield waited {gaps[-1] * 1000:.0f} ms: as long as a UI batch"
        assert gaps[len(gaps) // 2] < 0.005, "typical hand-over is immediate"
        assert len(slow_batches) < steps, "the UI got batches, not one message per step"
        assert app.chat_screen.answer.steps == steps
    # the engine's own time for the answer is the same with and without the (slow) UI attached
    assert engine_s < no_ui_s * 1.5 + 0.05, (engine_s, no_ui_s)
