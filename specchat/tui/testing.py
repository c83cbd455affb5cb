"""Helpers for UI tests: build the app around a scripted session or a recorded trace, and wait on
its state (polling between Pilot pauses, never fixed sleeps). Used by tests/tui; no pytest here."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.config import SpecConfig
from specchat.tui.app import SpecChatApp
from specchat.tui.fake import ScriptedSession, demo_answers
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
    prompt = pilot.app.screen.query_one(prompt_id)
    prompt.load_text(text)
    prompt.focus()
    await pilot.press("enter")


async def palette(pilot, typed: str, entry: str) -> None:
    """Open the command palette (Ctrl+P), type ``typed``, wait for an option reading ``entry`` and
    run it with Enter, as a user does."""
    await pilot.press("ctrl+p")
    await pilot.pause()
    await pilot.press(*typed)
    await wait_until(pilot, lambda: entry in str(
        [str(o.prompt) for o in pilot.app.screen.query_one("CommandList").options]), what=f"palette: {entry}")
    await pilot.press("enter")




# --- screenshot scenarios: the same states for the snapshot tests and the README screenshots --------
def _until_compare(records: Sequence[Record]) -> list[Record]:
    from specchat.tui.trace import UserTurn

    out = []
    for r in records:
        if isinstance(r, UserTurn) and r.mode == "compare":
            break
        out.append(r)
    return out


def _first_answer(records: Sequence[Record]) -> list[Record]:
    end = next(i for i, r in enumerate(records) if r.kind == "finished")
    return list(records[: end + 1])


async def settled_screenshot(pilot, title: str, tries: int = 20) -> str:
    """The screen once it stops changing: animations done, then two screenshots 20 ms apart that
    agree. Why: on a loaded machine a pane's scroll to the end was caught one frame early (the
    scrollbar thumb; twice in full-suite runs, never alone), which a snapshot reads as a change."""
    app = pilot.app
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()
    shot = app.export_screenshot(title=title)
    for _ in range(tries):
        await pilot.pause(0.02)
        again = app.export_screenshot(title=title)
        if again == shot:
            break
        shot = again
    return shot


async def _shot(pilot, title: str) -> str:
    # replays run at full speed (speed 0) in tests; show the speed a viewer would use
    app = pilot.app
    app.host.replay_speed = 1.0
    app.refresh_chrome()
    return await settled_screenshot(pilot, title)


async def scenario_chat(trace: str | Path, size: tuple[int, int] = SIZE, theme: str = "dark",
                        panels: bool = False) -> str:
    """Two chat turns replayed; the tree panel browsed back to a branching step (``panels``: F6 pressed,
    which at a narrow size stacks the side panels under the chat)."""
    _, records = read_trace(trace)
    app = replay_app(trace, _until_compare(records), ui=ui_settings(theme=theme))
    async with app.run_test(size=size) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        tree = app.chat_screen.tree
        entries = list(tree.history)
        best = max(range(len(entries)), key=lambda i: (entries[i].step.accepted_len > 0 and
                                                      bool(entries[i].step.rejected), len(entries[i].step.tree)))
        tree.browse(best - (len(entries) - 1))
        if panels:
            await pilot.press("f6")
        return await _shot(pilot, "specchat · chat")


async def scenario_compare(trace: str | Path, size: tuple[int, int] = SIZE, theme: str = "dark") -> str:
    app = replay_app(trace, ui=ui_settings(theme=theme))
    async with app.run_test(size=size) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        await wait_until(pilot, lambda: app.screen is app.compare_screen, what="compare screen")
        return await _shot(pilot, "specchat · compare")


async def scenario_teaching(trace: str | Path, size: tuple[int, int] = SIZE, steps: int = 4,
                            theme: str = "colourblind") -> str:
    """Step-through of the first answer, paused after a few steps, in the colour-blind safe theme."""
    _, records = read_trace(trace)
    app = replay_app(trace, _first_answer(records), step=True, ui=ui_settings(theme=theme))
    async with app.run_test(size=size) as pilot:
        await wait_loaded(pilot)
        for n in range(1, steps + 1):
            await wait_until(pilot, lambda n=n: app.gate_waiting and len(app.chat_screen.tree.history) == n,
                             what=f"step {n}")
            if n < steps:
                await pilot.press("f8")
        return await _shot(pilot, "specchat · teaching")


async def scenario_settings(size: tuple[int, int] = SIZE, theme: str = "light") -> str:
    """A live (scripted) answer, then the settings panel with a pending change, light theme."""
    session = make_session()
    app = make_app(session, ui=ui_settings(theme=theme, save_sessions=False), teach=True)
    async with app.run_test(size=size) as pilot:
        await wait_loaded(pilot)
        app.submit_prompt("What is speculative decoding?")
        await wait_until(pilot, lambda: app.gate_waiting, what="first step")
        for n in (2, 3):
            await pilot.press("f8")
            await wait_until(pilot, lambda n=n: app.gate_waiting and len(app.chat_screen.tree.history) == n)
        await pilot.press("f2")
        app.apply_setting("eagle_topk", "2")
        await pilot.pause()
        return await settled_screenshot(pilot, "specchat · settings")


def cut_answers(config: SpecConfig = CONFIG) -> list[list]:
    """The demo answers as an engine with the adaptive budget reports them: the drafter proposed a
    full tree of ``num_draft_tokens`` and the budget verified the scripted (smaller) tree."""
    import dataclasses

    from engine.events import Step

    return [[dataclasses.replace(ev, proposed=max(len(ev.tree), config.num_draft_tokens))
             if isinstance(ev, Step) and ev.index > 0 else ev for ev in answer] for answer in demo_answers(config)]


async def scenario_charts(size: tuple[int, int] = SIZE, theme: str = "dark") -> str:
    """Two scripted answers, then the charts view (F9) drawn from them."""
    app = make_app(ScriptedSession(cut_answers(), config=CONFIG), ui=ui_settings(theme=theme, save_sessions=False))
    async with app.run_test(size=size) as pilot:
        await wait_loaded(pilot)
        for prompt in ("What is speculative decoding?", "And a draft tree?"):
            app.submit_prompt(prompt)
            await wait_idle(pilot)
        await pilot.press("f9")
        await wait_until(pilot, lambda: getattr(app.screen, "drawn", -1) == app.charts.version, what="charts")
        return await settled_screenshot(pilot, "specchat · charts")
