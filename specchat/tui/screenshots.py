"""The README screenshots (SVG) of the chat, compare, teaching, settings and charts screens, from a trace:

    .venv/bin/python -m specchat.tui.screenshots TRACE.jsonl assets/

The same scenarios (the app driven headless, headless.py) drive the snapshot tests
(tests/tui/test_tui_snapshots.py), at 120x40, so a screenshot shows what a test checks.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from engine.config import SpecConfig
from engine.events import Step
from specchat.tui.headless import (
    CONFIG,
    SIZE,
    make_app,
    make_session,
    replay_app,
    ui_settings,
    wait_idle,
    wait_loaded,
    wait_until,
)
from specchat.tui.scripted import ScriptedSession, demo_answers
from specchat.tui.trace import Record, UserTurn, read_trace


def _until_compare(records: Sequence[Record]) -> list[Record]:
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
    app.refresh_status()
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


def block_method() -> str:
    """The first registered method whose drafter fills a block in one pass (its registration says)."""
    from engine import methods

    return next(m.name for m in methods.all_methods() if m.block)


async def scenario_block(size: tuple[int, int] = SIZE, theme: str = "dark", teach: bool = False) -> str:
    """A scripted answer of a block drafter, the tree panel browsed back to a block with accepted and
    refused positions (at a narrow size F6 stacks the panels under the chat); ``teach``: teaching mode
    paused on the fourth step instead."""
    config = CONFIG.replace(method=block_method(), num_draft_tokens=8)
    app = make_app(make_session(config=config), ui=ui_settings(theme=theme, save_sessions=False), teach=teach)
    async with app.run_test(size=size) as pilot:
        await wait_loaded(pilot)
        app.submit_prompt("What is speculative decoding?")
        tree = app.chat_screen.tree
        if teach:
            for n in range(1, 5):
                await wait_until(pilot, lambda n=n: app.gate_waiting and len(tree.history) == n, what=f"step {n}")
                if n < 4:
                    await pilot.press("f8")
            return await settled_screenshot(pilot, "specchat · teaching a block")
        await wait_idle(pilot)
        entries = list(tree.history)
        best = max(range(len(entries)), key=lambda i: (bool(entries[i].step.rejected), entries[i].step.accepted_len))
        tree.browse(best - (len(entries) - 1))
        if size[0] < 100:
            await pilot.press("f6")
        return await settled_screenshot(pilot, "specchat · a block drafted in one pass")


def cut_answers(config: SpecConfig = CONFIG) -> list[list]:
    """The demo answers as an engine with the adaptive budget reports them: the drafter proposed a
    full tree of ``num_draft_tokens`` and the budget verified the scripted (smaller) tree."""
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


async def _write_all(trace: Path, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    shots = {
        "screenshot-chat.svg": scenario_chat(trace),
        "screenshot-compare.svg": scenario_compare(trace),
        "screenshot-teaching.svg": scenario_teaching(trace),
        "screenshot-settings.svg": scenario_settings(),
        "screenshot-charts.svg": scenario_charts(),
    }
    written = []
    for name, scenario in shots.items():
        path = out / name
        path.write_text(await scenario, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specchat.tui.screenshots")
    p.add_argument("trace", type=Path, help="a trace with two chat turns and a compare turn")
    p.add_argument("out", type=Path, nargs="?", default=Path("assets"))
    args = p.parse_args(argv)
    for path in asyncio.run(_write_all(args.trace, args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
