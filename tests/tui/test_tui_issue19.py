"""Issue 19 in the app: a conversation cut by a crash reopens, the compare badge claims no speed-up
it did not measure, and the app's parts keep their seams (one Host surface, commands by table)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from textual.widgets import OptionList

from specchat.tui import engine_process
from specchat.tui.backpressure import UiLag
from specchat.tui.engine_process import ProcessHost
from specchat.tui.headless import CONFIG, SIZE, make_app, make_session, wait_idle, wait_loaded, wait_until
from specchat.tui.host import EngineHost
from specchat.tui.host_api import Host
from specchat.tui.screens.dialogs import SessionsScreen
from specchat.tui.scripted import ScriptedLoader, baseline_answer, synthetic_answer
from specchat.tui.sessions import list_sessions
from specchat.tui.trace import UserTurn, read_trace
from specchat.tui.widgets.transcript import AnswerView
from tests.tui.helpers import send, spy_notes


# --- a saved conversation whose last line was cut ---------------------------------------------------------
async def test_a_conversation_cut_by_a_crash_is_listed_reopened_and_says_what_was_lost():
    session = make_session()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        notes = spy_notes(app)
        await send(pilot, "first question")
        await wait_idle(pilot)
        saved_path = Path(app.host.record_path)
        await pilot.press("ctrl+n")  # a new file for the next chat; the first is left as a crash leaves it
        await wait_idle(pilot)
        with saved_path.open("a", encoding="utf-8") as fh:
            fh.write('{"kind":"user","text":"a second question, cut mid-wri')
        saved = list_sessions()
        assert [s.path for s in saved] == [saved_path], "still listed"
        assert saved[0].turns == 1 and saved[0].title == "first question"
        await pilot.press("ctrl+o")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionsScreen))
        app.screen.query_one(OptionList).focus()
        await pilot.press("enter")
        await wait_idle(pilot)
        assert not any(n.startswith("cannot reopen") for n in notes), notes
        assert any("1 damaged line left out" in n for n in notes), notes
        assert app.chat_screen.query(AnswerView), "every complete record is back"
        assert session.messages[0]["content"] == "first question"
        _, records = read_trace(saved_path)  # strict: the file was rewritten without the cut line
        assert [r.text for r in records if isinstance(r, UserTurn)] == ["first question"]


# --- the compare badge --------------------------------------------------------------------------------------
async def _badge(baseline, spec) -> str:
    app = make_app(make_session())
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        screen = app.compare_screen
        app.switch_screen("compare")
        await wait_until(pilot, lambda: screen.ready)
        screen.show_records("spec", [UserTurn(text="q", mode="compare")])
        screen.show_records("baseline", baseline)
        screen.show_records("spec", spec)
        return screen.badge_text


async def test_compare_reports_no_speed_up_when_no_draft_was_accepted():
    """The issue's case: the speculative side drafted nothing (tau 1.00), yet the badge said 1.25x."""
    words = synthetic_answer("Nineteen tokens or so of an answer, short and plain.", config=CONFIG)
    badge = await _badge(baseline_answer(words, verify_ms=20.0, seed=1), baseline_answer(words, verify_ms=16.0,
                                                                                        seed=2))
    assert badge.startswith("✓ identical")
    assert "×" not in badge and "no drafts accepted" in badge, "no ratio for equal work"
    assert "tok/s" in badge, "the two speeds are still shown"


async def test_compare_calls_a_short_run_within_noise():
    spec = synthetic_answer("Short answers time badly.", config=CONFIG)
    badge = await _badge(baseline_answer(spec), spec)
    assert "×" not in badge and "within noise at 5 tokens" in badge


# --- seams ------------------------------------------------------------------------------------------------
def test_both_hosts_implement_the_host_protocol_with_the_same_signatures():
    thread_host = EngineHost(None, lambda: None)
    process_host = ProcessHost(ScriptedLoader(CONFIG), lambda: None)
    try:
        assert isinstance(thread_host, Host) and isinstance(process_host, Host)
        for name, member in inspect.getmembers(Host, inspect.isfunction):
            if name.startswith("_"):
                continue
            want = inspect.signature(member)
            for host in (EngineHost, ProcessHost):
                assert inspect.signature(getattr(host, name)) == want, f"{host.__name__}.{name}"
    finally:
        process_host.shutdown()


def test_the_engine_child_has_a_handler_for_every_command_the_parent_sends():
    sent = set(re.findall(r'_(?:send|call)\("(\w+)"', inspect.getsource(engine_process))) - {"shutdown"}
    handlers = engine_process._command_handlers(EngineHost(None, lambda: None), rpc_out=None, lag=UiLag())
    assert sent == set(handlers)


async def test_the_palette_changes_a_setting_by_message():
    app = make_app(make_session())
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        from specchat.tui.messages import ChangeSetting

        app.post_message(ChangeSetting("steps", "3"))
        await wait_until(pilot, lambda: app.applied_config.num_steps == 3, what="applied")
        await send(pilot, "still answers")
        await wait_idle(pilot)

