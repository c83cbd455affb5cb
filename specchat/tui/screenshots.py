"""Write the README screenshots (SVG) of the chat, compare, teaching, settings and charts screens from a trace:

    .venv/bin/python -m specchat.tui.screenshots TRACE.jsonl assets/

The same scenarios drive the snapshot tests (specchat/tui/testing.py), at 120x40.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from specchat.tui import testing


async def _write_all(trace: Path, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    shots = {
        "screenshot-chat.svg": testing.scenario_chat(trace),
        "screenshot-compare.svg": testing.scenario_compare(trace),
        "screenshot-teaching.svg": testing.scenario_teaching(trace),
        "screenshot-settings.svg": testing.scenario_settings(),
        "screenshot-charts.svg": testing.scenario_charts(),
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
