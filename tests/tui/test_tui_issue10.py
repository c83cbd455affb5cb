"""The TUI as a new user meets it: layout at 80 columns, contrast in every theme, context and
prefill, fair compare, knobs by drafter, teaching texts, saved sessions, confirmations."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from textual.widgets import Input, OptionList, ProgressBar

from engine.config import SpecConfig
from engine.events import Finished, PrefillProgress, RunningStats
from engine.methods import draft_methods
from specchat.themes import THEMES, contrast_ratio
from specchat.tui import headless
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
from specchat.tui.host import EngineHost, wait_items
from specchat.tui.host_api import CompareJob, JobDone
from specchat.tui.screens.dialogs import ConfirmScreen, SessionsScreen
from specchat.tui.scripted import ScriptedSession, demo_answers, synthetic_answer
from specchat.tui.trace import read_trace
from specchat.tui.widgets.transcript import AnswerView
from tests.tui.helpers import send

TRACE = Path(__file__).parent / "fixtures" / "demo.jsonl"
NGRAM = SpecConfig(method="ngram", num_draft_tokens=8)


def ngram_session(**kw) -> ScriptedSession:
    kw.setdefault("config", NGRAM)
    kw.setdefault("refuse_methods", {m: f"method {m!r} is not available (load a draft with --draft)"
                                     for m in draft_methods()})
    return ScriptedSession(demo_answers(kw["config"]), **kw)


GLYPHS = set("▔▁▏▕─│╭╮╰╯┃━▃▄▅▆▇█░▌▐▼▲▶◀ ")


# --- contrast -------------------------------------------------------------------------------------------
def _segments_below_contrast(app, minimum: float = 4.5) -> list[str]:
    bad = []
    for y, strip in enumerate(app.screen._compositor.render_strips()):
        for seg in strip:
            style = seg.style
            if not seg.text.strip() or style is None or style.color is None or style.bgcolor is None:
                continue
            fg, bg = style.color.get_truecolor(), style.bgcolor.get_truecolor()
            if set(seg.text.strip()) <= GLYPHS:  # rules, borders, bars and arrows: not text
                continue
            ratio = contrast_ratio("#{:02X}{:02X}{:02X}".format(*fg), "#{:02X}{:02X}{:02X}".format(*bg))
            if ratio < minimum:
                bad.append(f"row {y} {seg.text.strip()[:30]!r}: {ratio:.2f}")
    return bad


@pytest.mark.parametrize("theme", ["dark", "light", "colourblind"])
async def test_every_label_reads_at_4_5_to_1_in_every_theme(theme):
    """Chat (stats, tree, transcript, title, footer), settings and compare: each text segment on screen."""
    session = make_session()
    app = make_app(session, ui=ui_settings(theme=theme, show_rejected=True))
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "What is speculative decoding?")
        await wait_idle(pilot)
        bad = _segments_below_contrast(app)
        await pilot.press("f2")
        await pilot.pause()
        bad += ["settings " + b for b in _segments_below_contrast(app)]
        await pilot.press("escape")
        await pilot.press("f3")
        await send(pilot, "Compare this", "#compare-prompt")
        await wait_idle(pilot)
        bad += ["compare " + b for b in _segments_below_contrast(app)]
    assert not bad, f"{theme}: text below 4.5:1: " + "; ".join(bad[:12])


def test_theme_variables_contrast_with_the_panels_they_sit_on():
    for theme in THEMES:
        v = theme.variables
        for name in ("label", "tok-draft", "tok-target", "tok-rejected", "tree-unreached", "tree-prob", "pending"):
            for bg in (theme.background, theme.surface, theme.panel):
                assert contrast_ratio(v[name], bg) >= 4.5, (theme.name, name, bg)


# --- layout ---------------------------------------------------------------------------------------------
async def test_side_panels_collapse_below_100_columns_and_f6_stacks_them():
    app = make_app(make_session())
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_loaded(pilot)
        screen = app.chat_screen
        side, left = screen.query_one("#side"), screen.query_one("#left")
        assert screen.has_class("-narrow") and not side.display
        assert left.size.width >= 78, "the chat gets the whole width"
        await pilot.press("f6")
        await pilot.pause()
        assert side.display and side.region.y > left.region.y, "stacked under the chat"
        assert side.size.width >= 78
        await pilot.press("f6")
        await pilot.pause()
        assert not side.display
    app = make_app(make_session())
    async with app.run_test(size=(60, 20)) as pilot:
        await wait_loaded(pilot)
        assert app.chat_screen.query_one("#left").size.width >= 58
    app = make_app(make_session())
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_loaded(pilot)
        side = app.chat_screen.query_one("#side")
        assert side.display and side.size.width >= 38
        await pilot.press("f6")
        await pilot.pause()
        assert not side.display


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_f2_shows_the_settings_where_f6_hid_the_panels(size):
    """The settings live in the side panels: with those hidden (F6, or a narrow screen) F2 still shows
    them, and Esc returns to the panels as they were (a session-49 walk found F2 doing nothing)."""
    app = make_app(make_session())
    async with app.run_test(size=size) as pilot:
        await wait_loaded(pilot)
        side, settings = app.chat_screen.query_one("#side"), app.chat_screen.settings
        if side.display:
            await pilot.press("f6")
            await pilot.pause()
        assert not side.display
        await pilot.press("f2")
        await pilot.pause()
        assert side.display and settings.display and settings.size.height >= 5
        await pilot.press("escape")
        await pilot.pause()
        assert not side.display
        await pilot.press("f4")  # teaching explains each step in the side panels: they open
        await pilot.pause()
        assert side.display and app.chat_screen.query_one("#teach").display


async def test_teaching_from_the_start_shows_its_panel_on_a_narrow_screen():
    """`specchat run --teach` at 80x24: the explanation is in the stacked side panels, opened for it."""
    app = make_app(make_session(), teach=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_loaded(pilot)
        await pilot.pause()
        assert app.chat_screen.query_one("#side").display and app.chat_screen.query_one("#teach").display


async def test_title_puts_the_status_first_so_80_columns_keep_it():
    session = make_session(step_delay=0.3)
    app = make_app(session)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "hello")
        await wait_until(pilot, lambda: "answering" in str(app.chat_screen.query_one("#title").render()))
        title = app.chat_screen.query_one("#title")
        line = "".join(seg.text for seg in title.render_line(0))
        assert "answering… Esc stops" in line[:60]
        await pilot.press("escape")
        await wait_idle(pilot)


# --- esc, typing, settings fields ------------------------------------------------------------------------
async def test_esc_in_settings_closes_the_panel_and_leaves_the_answer_running():
    session = make_session(step_delay=0.3)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "hello")
        await wait_until(pilot, lambda: app.chat_screen.answer is not None)
        await pilot.press("f2")
        await pilot.pause()
        assert app.chat_screen.has_class("-settings")
        await pilot.press("escape")
        await pilot.pause()
        assert not app.chat_screen.has_class("-settings")
        assert app.busy_job is not None and not app._stopping, "the answer goes on"
        await pilot.press("escape")  # a second Esc stops it
        await wait_idle(pilot)
        assert app.chat_screen.answer.finished.reason == "cancelled"


async def test_typing_in_the_tree_panel_goes_to_the_prompt():
    app = make_app(make_session())
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        app.chat_screen.tree.focus()
        await pilot.press("h", "i")
        assert app.chat_screen.prompt.text == "hi" and app.chat_screen.prompt.has_focus


async def test_text_typed_while_loading_is_kept_and_sent_when_ready():
    gate = threading.Event()
    session = make_session()

    def factory(progress):
        gate.wait(10)
        return session

    app = make_app(session)
    app.host._factory = factory
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.screen is app.loading_screen
        await pilot.press(*"hello", "enter")
        gate.set()
        await wait_loaded(pilot)
        await wait_idle(pilot)
        await wait_until(pilot, lambda: session.calls == [("chat", "hello")], what="the early message sent")


async def test_a_refused_field_is_selected_so_the_next_keys_replace_it():
    app = make_app(make_session())
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await pilot.press("f2")
        await pilot.pause()
        field = app.chat_screen.settings.query_one("#set-num_steps", Input)
        field.focus()
        field.value = "0"
        await pilot.press("enter")
        await pilot.pause()
        assert field.value == "5"
        await pilot.press("3", "enter")
        await pilot.pause()
        assert app.applied_config.num_steps == 3, "typed 3 replaced the value (never '53')"


async def test_failed_load_stops_the_progress_animation():
    def factory(progress):
        raise RuntimeError("no such model: typo")

    app = make_app(make_session())
    app.host._factory = factory
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.load_error != "")
        screen = app.loading_screen
        assert not screen.query_one(ProgressBar).display
        assert "starting the engine" not in str(screen.query_one("#loading-stage").render())
        assert "no such model" in str(screen.query_one("#loading-error").render())


# --- words on screen ---------------------------------------------------------------------------------------
async def test_markers_and_counts_read_as_words():
    answer = synthetic_answer("One two three four five six seven eight nine ten eleven twelve.",
                              config=headless.CONFIG)
    short = synthetic_answer("Hi", config=headless.CONFIG)
    session = ScriptedSession([answer, short], config=headless.CONFIG, step_delay=0.3)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "count")
        await wait_until(pilot, lambda: app.chat_screen.answer is not None)
        assert app.apply_setting("num_steps", "3") is None
        await wait_idle(pilot)
        session.step_delay = 0
        text = str(app.chat_screen.answer.stream.build_content())
        assert "⚙ new settings from here" in text and "⚙v" not in text
        await send(pilot, "hi")
        await wait_idle(pilot)
        stats = str(app.chat_screen.stats.render())
        assert "1 token in 1 step" in stats


async def test_palette_hints_give_values_that_fit_the_setting():
    from specchat.tui.settings_schema import FIELDS, example_value

    assert example_value(FIELDS["method"], "ngram") != "3"
    assert example_value(FIELDS["context_overflow"], "refuse") == "drop_oldest"
    assert example_value(FIELDS["num_steps"]) == "3"


async def test_tree_follows_a_new_answer_after_browsing():
    app = make_app(make_session())
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "one")
        await wait_idle(pilot)
        tree = app.chat_screen.tree
        tree.browse(-3)
        assert not tree.live
        await send(pilot, "two")
        await wait_idle(pilot)
        assert tree.live and tree.current.answer == "answer 2"


# --- rejected drafts and compare ----------------------------------------------------------------------
async def test_refused_drafts_are_hidden_until_f5_in_chat_and_compare():
    app = make_app(make_session())
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "hello")
        await wait_idle(pilot)
        stream = app.chat_screen.answer.stream
        assert any(k == "rejected" for _, k in stream.pieces)
        assert str(stream.build_content()) == stream.plain_text, "hidden by default"
        await pilot.press("f3")
        await send(pilot, "compare", "#compare-prompt")
        await wait_idle(pilot)
        spec = app.compare_screen.pane("spec").stream
        assert str(spec.build_content()) == spec.plain_text
        await pilot.press("f5")
        await pilot.pause()
        assert str(spec.build_content()) != spec.plain_text, "F5 shows them in compare too"
        await pilot.press("f5")
        await pilot.pause()
        assert str(spec.build_content()) == spec.plain_text, "and F5 off hides them again"


def test_compare_runs_alternate_and_start_from_the_same_cache_state():
    from engine.drafters.base import NoDrafter
    from engine.drafters.ngram import NgramDrafter
    from engine.events import Started
    from engine.session import Session
    from tests.tiny import TinyTokenizer, our_model

    session = Session(our_model("llama", 0)[0], TinyTokenizer(stop_ids=frozenset()),
                      SpecConfig(method="ngram", max_new_tokens=8), drafters={"none": NoDrafter, "ngram": NgramDrafter})
    list(session.chat("HELLO" * 4))
    host = EngineHost(lambda progress: session, lambda: None)
    thread = threading.Thread(target=host.run, daemon=True)
    thread.start()
    try:
        orders, reused = [], []
        for _ in range(2):
            job = host.submit(CompareJob("AGAIN"))
            items = wait_items(host, lambda got, j=job: any(isinstance(i, JobDone) and i.job == j for i in got),
                               timeout=60)
            started = [(i.lane, i.record) for i in items if hasattr(i, "record") and isinstance(i.record, Started)]
            orders.append([lane for lane, _ in started])
            reused.append({r.reused_tokens for _, r in started})
        assert orders == [["baseline", "spec"], ["spec", "baseline"]]
        assert all(len(r) == 1 and next(iter(r)) > 0 for r in reused), "both warm, from the same prefix"
    finally:
        host.shutdown()
        thread.join(10)


async def test_compare_badge_says_the_cache_state_and_the_order():
    app = make_app(make_session())
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await pilot.press("f3")
        await send(pilot, "compare", "#compare-prompt")
        await wait_idle(pilot)
        assert "both cold, baseline first" in app.compare_screen.badge_text
        await send(pilot, "compare", "#compare-prompt")
        await wait_idle(pilot)
        assert "speculative first" in app.compare_screen.badge_text


# --- knobs by drafter ------------------------------------------------------------------------------------
async def test_settings_grey_out_knobs_the_drafter_ignores_and_offer_only_loadable_methods():
    session = ngram_session()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await pilot.press("f2")
        await pilot.pause()
        panel = app.chat_screen.settings
        assert panel.query_one("#set-eagle_topk").disabled and panel.query_one("#set-num_steps").disabled
        assert "not used by ngram" in str(panel.query_one("#status-eagle_topk").render())
        assert not panel.query_one("#set-ngram_max_match_window_size").disabled
        options = [str(o[0]) for o in panel.query_one("#set-method")._options]
        assert options == ["none", "ngram"]
        assert "not used by ngram" in app.apply_setting("eagle_topk", "2")
        assert app.applied_config.eagle_topk == NGRAM.eagle_topk
        # the palette offers only what acts on the method
        from specchat.tui.commands import SettingsCommands

        names = [f.name for f in SettingsCommands(app.screen)._fields()]
        assert "eagle_topk" not in names and "ngram_max_bfs_breadth" in names
        # a cross-field rule still refuses with its reason
        assert "must be >=" in app.apply_setting("ngram_min_bfs_breadth", "20")  # above max breadth 10
        # baseline: every drafting knob is greyed
        app.apply_setting("method", "none")
        await pilot.pause()
        assert panel.query_one("#set-num_draft_tokens").disabled


# --- teaching -----------------------------------------------------------------------------------------------
async def test_teaching_says_where_ngram_drafts_come_from_and_shows_no_probabilities():
    session = ngram_session()
    app = make_app(session, teach=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        assert app.applied_config.adaptive_draft is False, "teaching verifies the whole proposal"
        await send(pilot, "teach me")
        await wait_until(pilot, lambda: app.gate_waiting)
        teach = str(app.chat_screen.query_one("#teach").render())
        assert "Prefill." in teach
        for _ in range(6):
            n = len(app.chat_screen.tree.history)
            await pilot.press("f8")
            await wait_until(pilot, lambda n=n: len(app.chat_screen.tree.history) == n + 1 and app.gate_waiting)
            if app.chat_screen.tree.current.step.tree.num_drafts:
                break
        step = app.chat_screen.tree.current.step
        teach = str(app.chat_screen.query_one("#teach").render())
        assert "copied from earlier text" in teach and "where the last few tokens matched" in teach
        lines = app.chat_screen.tree.view.lines
        assert not any("1.00" in line for line in lines[1:]), "n-gram drafts carry no probabilities"
        assert any(word in lines[-1] or word in "".join(lines) for word in ("correction", "bonus"))
        assert step.tree.has_probs is False
        await pilot.press("f4")
        await wait_idle(pilot)
        assert app.applied_config.adaptive_draft is True, "the user's choice comes back"
        meta = str(app.chat_screen.answer.meta.render())
        assert "engine time" in meta, "speed of a paused answer excludes the pauses"


# --- context and prefill ------------------------------------------------------------------------------------
async def test_a_turn_that_does_not_fit_is_refused_with_the_ctrl_n_hint():
    refused = [Finished(reason="context", error="the prompt is 9000 tokens; it does not fit the model's context of "
                                                 "8192 tokens")]
    session = ScriptedSession([refused], config=NGRAM)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "a very long paste")
        await wait_idle(pilot)
        notes = [str(n.render()) for n in app.chat_screen.query(".note")]
        assert any("not sent" in n and "8192" in n and "Ctrl+N" in n for n in notes)
        assert not app.chat_screen.query(AnswerView)
        assert session.messages == []


async def test_prefill_progress_shows_and_esc_cancels_it():
    stats = RunningStats()
    answer = [PrefillProgress(done=64 * i, total=6000, elapsed_ms=40.0) for i in range(1, 60)]
    answer += synthetic_answer("never", config=NGRAM)
    session = ScriptedSession([answer], config=NGRAM, step_delay=None)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "long prompt")
        await wait_until(pilot, lambda: app.prefill is not None)
        assert "reading the prompt" in str(app.chat_screen.query_one("#title").render())
        assert "prefill" in str(app.chat_screen.stats.render())
        await pilot.press("escape")
        await wait_idle(pilot)
        assert app.prefill is None
        notes = [str(n.render()) for n in app.chat_screen.query(".note")]
        assert any("cancelled during the prefill" in n for n in notes)
        assert session.messages == [] and stats.tokens == 0


async def test_context_use_is_shown():
    answer = synthetic_answer("Hello there.", config=NGRAM)
    from dataclasses import replace

    answer[0] = replace(answer[0], context_limit=8192, prompt_tokens=100)
    app = make_app(ScriptedSession([answer], config=NGRAM))
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "hi")
        await wait_idle(pilot)
        assert "context" in str(app.chat_screen.stats.render()) and "/8,192" in str(app.chat_screen.stats.render())
        assert "ctx " in str(app.chat_screen.query_one("#title").render())


# --- sessions, export, confirmations --------------------------------------------------------------------------
async def test_conversations_are_saved_reopened_and_exported(tmp_path):
    from specchat.tui.sessions import list_sessions

    session = make_session()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "first question")
        await wait_idle(pilot)
        paths = app.action_export("conversation")
        assert [p.suffix for p in paths] == [".md", ".html", ".svg"]
        md = paths[0].read_text()
        assert "first question" in md and "Speculative decoding" in md
        html = paths[1].read_text()
        assert "#4ebf71" in html.lower() and "underline" in html, "token colours and cues in the snapshot"
        await pilot.press("ctrl+n")
        await wait_idle(pilot)
        saved = list_sessions()
        assert len(saved) == 1 and saved[0].title == "first question" and saved[0].turns == 1
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        app.screen.query_one(OptionList).focus()
        await pilot.press("enter")
        await wait_idle(pilot)
        assert [m["role"] for m in session.messages] == ["user", "assistant"]
        assert session.messages[0]["content"] == "first question"
        assert app.chat_screen.query(AnswerView), "the transcript is back"
        await send(pilot, "second question")
        await wait_idle(pilot)
        _, records = read_trace(saved[0].path)
        assert sum(r.kind == "user" for r in records) == 2, "the reopened conversation goes on in its file"


async def test_an_export_never_replaces_an_earlier_one_and_a_full_disk_is_a_notice(tmp_path, monkeypatch):
    """Two exports in one second were named alike (the second replaced the first); a full disk (or an
    exports folder that cannot be written) raised out of the action and ended the app with a traceback."""
    import errno
    import os
    import time

    from specchat.tui.sessions import exports_dir

    monkeypatch.setattr(time, "strftime", lambda fmt, *a: fmt.replace("%Y-%m-%d_%H-%M-%S", "same-second"))
    app = make_app(make_session())
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "first question")
        await wait_idle(pilot)
        first = app.action_export("conversation")
        second = app.action_export("conversation")
        assert [p.name for p in second] == [f"same-second-conversation-2{p.suffix}" for p in first]
        assert all(p.exists() for p in first)

        def full(*args):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(os, "fsync", full)
        assert app.action_export("answer") == []
        await pilot.pause()
        assert any("not exported" in n.message and "No space left on device" in n.message
                   for n in app._notifications), list(app._notifications)
        assert sorted(p.name for p in exports_dir().iterdir() if "answer" in p.name) == []


async def test_quit_and_new_chat_ask_first_while_an_answer_runs():
    session = make_session(step_delay=0.3)
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "hello")
        await wait_until(pilot, lambda: app.chat_screen.answer is not None)
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("n")
        await pilot.pause()
        assert app.busy_job is not None and app.chat_screen.answer is not None
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("escape")
        await pilot.pause()
        assert app.is_running
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_idle(pilot)
        await wait_until(pilot, lambda: not app.chat_screen.query(AnswerView), what="new conversation")


async def test_replay_has_no_saved_session_file(tmp_path):
    app = replay_app(TRACE, speed=0)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        assert app.host.record_path is None
