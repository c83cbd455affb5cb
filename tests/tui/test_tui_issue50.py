"""Issue 50 in the app: nothing in the data folder or the config can freeze, break or silence it.

A FIFO among the saved conversations (Ctrl+O froze the app), a full disk under the sessions
folder (the answer stopped, a traceback at quit), a key binding Textual cannot read (Ctrl+Q went
dead and the footer said "Press ctrl+banana to quit").
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from pathlib import Path

from textual.widgets import OptionList

from specchat.tui.headless import SIZE, make_app, make_session, send, wait_idle, wait_loaded, wait_until
from specchat.tui.screens.dialogs import SessionsScreen
from specchat.tui.sessions import list_sessions, sessions_dir
from specchat.tui.trace import TraceWriter
from tests.tui.helpers import spy_notes


# --- a FIFO among the saved conversations --------------------------------------------------------------------
async def test_ctrl_o_lists_regular_files_only_and_a_fifo_never_freezes_the_app():
    """A FIFO named ``x.jsonl`` in the sessions folder froze the whole app at Ctrl+O (opening it waits for a
    writer): the list skips what is not a regular file without opening it, and reads off the event loop."""
    session = make_session()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "first question")
        await wait_idle(pilot)
        saved_path = Path(app.host.record_path)
        await pilot.press("ctrl+n")
        await wait_idle(pilot)
        fifo = sessions_dir() / "x.jsonl"
        os.mkfifo(fifo)
        os.symlink(fifo, sessions_dir() / "link.jsonl")
        try:
            assert [s.path for s in await asyncio.wait_for(asyncio.to_thread(list_sessions), 10)] == [saved_path]
            await pilot.press("ctrl+o")
            await asyncio.wait_for(wait_until(pilot, lambda: isinstance(app.screen, SessionsScreen)), 20)
            assert app.screen.query_one(OptionList).option_count == 1
        finally:
            _release_readers(fifo)


def _release_readers(fifo: Path) -> None:
    """Open ``fifo`` for writing and close it: a reader stuck in its open (the bug) returns, and the test ends."""
    with contextlib.suppress(OSError):  # no reader waiting: nothing to release
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


# --- a full disk under the sessions folder ---------------------------------------------------------------------
async def test_a_full_disk_keeps_the_conversation_in_memory_and_says_so_once(monkeypatch):
    """Saving failing mid-answer (ENOSPC) stopped the answer and left a traceback at quit: now the answer
    finishes, the conversation stays in memory and goes on, and one notification says why it is not saved."""
    written = {"lines": 0}
    real_write_line = TraceWriter._write_line

    def write_line(self, data):
        written["lines"] += 1
        if written["lines"] > 3:  # the header, the user's turn and a record or two: then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_line(self, data)

    monkeypatch.setattr(TraceWriter, "_write_line", write_line)
    session = make_session()
    app = make_app(session)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        notes = spy_notes(app)
        await send(pilot, "first question")
        await wait_idle(pilot)
        await send(pilot, "second question")
        await wait_idle(pilot)
        assert [m["role"] for m in session.messages] == ["user", "assistant"] * 2, "both answers ran to the end"
        failed = [n for n in notes if "could not save" in n]
        assert len(failed) == 1 and "No space left on device" in failed[0] and "in memory" in failed[0], notes
        assert not any("failed" in n for n in notes), notes
        await pilot.press("ctrl+q")
    assert app.return_code in (0, None)


# --- a key binding Textual cannot read -------------------------------------------------------------------------
def test_a_broken_key_binding_is_refused_with_a_warning_and_the_default_kept(tmp_path):
    """``quit = "ctrl+banana"`` silently replaced Ctrl+Q with a key no terminal sends; now it is refused in one
    line naming the key and the action, and Ctrl+Q stays."""
    from specchat.tui.userconfig import load_ui_settings

    config = tmp_path / "config.toml"
    config.write_text('[keys]\nquit = "ctrl+banana"\nnext-step = "f8,n"\nhelp = "f1,banana"\ncharts = "f25"\n')
    ui, warnings = load_ui_settings(config)
    assert dict(ui.keymap) == {"next-step": "f8,n"}
    assert len(warnings) == 3 and all(w.count("\n") == 0 for w in warnings), warnings
    quit_warning = next(w for w in warnings if "keys.quit" in w)
    assert "'ctrl+banana' is not a key" in quit_warning and "quit stays on ctrl+q" in quit_warning
    assert any("'banana'" in w and "help stays on f1" in w for w in warnings)


def test_every_default_and_usual_key_is_accepted():
    from specchat.tui.keys import APP_KEYS, bad_keys, is_key

    assert not [k.key for k in APP_KEYS if bad_keys(k.key)]
    assert all(map(is_key, ["ctrl+q", "f8", "n", "N", "?", "plus", "minus", "equals_sign", "question_mark",
                            "shift+tab", "ctrl+shift+up", "alt+x", "enter", "ctrl+space", "pagedown"]))
    assert not any(map(is_key, ["ctrl+banana", "banana", "f25", "ctrl+", "", "hyperspace+q", "ctrl+ q"]))


async def test_ctrl_q_still_quits_after_a_broken_binding(tmp_path):
    from specchat.tui.userconfig import load_ui_settings

    config = tmp_path / "config.toml"
    config.write_text('[keys]\nquit = "ctrl+banana"\n')
    ui, _ = load_ui_settings(config)
    app = make_app(make_session(), ui=ui.replace(save_sessions=False))
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await pilot.press("ctrl+q")
        await asyncio.wait_for(wait_until(pilot, lambda: not app.is_running), 10)
