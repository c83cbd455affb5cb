"""The app with no terminal: built around a scripted session or a recorded trace, and waited on
(polling between Textual Pilot pauses, never fixed sleeps).

Why in the app: the README screenshots (screenshots.py) drive the app this way, and the UI tests
(tests/tui) build on the same builders, so a screenshot and its snapshot test show one state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.config import SpecConfig
from specchat.tui.app import SpecChatApp
from specchat.tui.scripted import ScriptedSession, demo_answers
from specchat.tui.trace import Record, ReplaySource, read_trace
from specchat.tui.userconfig import UISettings

SIZE = (120, 40)
CONFIG = SpecConfig(method="eagle3", num_steps=5, eagle_topk=4, num_draft_tokens=16)


def ui_settings(**kw) -> UISettings:
    kw.setdefault("theme", "dark")
    return UISettings(cursor_blink=False, **kw)


def make_session(**kw) -> ScriptedSession:
    kw.setdefault("config", CONFIG)
    return ScriptedSession(demo_answers(kw["config"]), **kw)


def make_app(session: ScriptedSession | None = None, **kw) -> SpecChatApp:
    session = session or make_session()
    kw.setdefault("ui", ui_settings())
    return SpecChatApp(factory=lambda progress: session, config=session.config, **kw)


def replay_app(trace: str | Path, records: Sequence[Record] | None = None, *, step: bool = False,
               speed: float = 0.0, **kw) -> SpecChatApp:
    header, all_records = read_trace(trace)
    records = all_records if records is None else records
    kw.setdefault("ui", ui_settings())
    return SpecChatApp(
        factory=None,
        config=SpecConfig.from_dict(header["config"]),
        replay=ReplaySource(str(trace), header, tuple(records), speed=speed, step=step),
        **kw,
    )


async def wait_until(pilot, cond: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await pilot.pause(0.01)
    await pilot.pause()


async def wait_loaded(pilot) -> None:
    app = pilot.app
    await wait_until(pilot, lambda: app.loaded and app.screen.id in ("chat", "compare"), what="load")


async def wait_idle(pilot) -> None:
    app = pilot.app
    await wait_until(pilot, lambda: app.busy_job is None, what="engine idle")
    await pilot.pause()


async def send(pilot, text: str, prompt_id: str = "#prompt") -> None:
    """Type ``text`` into the prompt and press Enter, as a user does (tests, the device plan's chat)."""
    prompt = pilot.app.screen.query_one(prompt_id)
    prompt.load_text(text)
    prompt.focus()
    await pilot.press("enter")
