"""Issue 55 in the app: a config file that is not a regular file never freezes it.

``SPECCHAT_CONFIG`` naming a FIFO froze the TUI before its first frame (the read waited for a
writer; Ctrl+Q did nothing), and ``/dev/zero`` was read until memory ran out. Now either is one
warning, the defaults are used, and the app starts and quits as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest

from specchat.tui.headless import SIZE, make_app, make_session, wait_loaded, wait_until


def _release_readers(fifo: Path) -> None:
    """Open ``fifo`` for writing and close it: a reader stuck in its open (the bug) returns, and the test ends."""
    with contextlib.suppress(OSError):  # no reader waiting: nothing to release
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("kind", ["fifo", "device"])
async def test_a_config_that_is_not_a_file_is_one_warning_and_the_app_still_quits(kind, tmp_path, monkeypatch):
    from specchat.tui.launch import _ui_settings
    from specchat.tui.userconfig import UISettings

    config = tmp_path / "config.toml"
    if kind == "fifo":
        os.mkfifo(config)
    else:
        config = Path("/dev/zero")
    monkeypatch.setenv("SPECCHAT_CONFIG", str(config))
    try:
        ui, warnings = await asyncio.wait_for(asyncio.to_thread(_ui_settings, None), 10)
    finally:
        if kind == "fifo":
            _release_readers(config)
    assert ui == UISettings()
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert warnings[0].startswith(f"{config}: not a regular file (") and warnings[0].endswith("; using defaults")
    app = make_app(make_session(), ui=ui.replace(save_sessions=False, cursor_blink=False), warnings=warnings)
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await pilot.press("ctrl+q")
        await asyncio.wait_for(wait_until(pilot, lambda: not app.is_running), 10)


def test_a_config_over_the_bound_is_refused_unread(tmp_path):
    """A config file is a few lines: one of over 1 MiB (a log or a dump named by mistake) is not parsed."""
    from specchat.tui.userconfig import UISettings, load_ui_settings

    config = tmp_path / "config.toml"
    config.write_text('theme = "light"\n' + "#" * 2**20 + "\n")
    ui, warnings = load_ui_settings(config)
    assert ui == UISettings() and len(warnings) == 1
    assert "over 1 MiB, too big to be a TOML config file" in warnings[0], warnings
