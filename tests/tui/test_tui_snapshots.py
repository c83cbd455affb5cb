"""SVG snapshots of the main screens (fixed size, fixed theme, no cursor blink, no clocks), compared
with the baselines committed in tests/tui/snapshots/. After an intended change of the look:

    SPECCHAT_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/tui/test_tui_snapshots.py

and review the new SVGs (open them in a browser) before committing them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specchat.tui import screenshots

HERE = Path(__file__).parent
TRACE = HERE / "fixtures" / "demo.jsonl"
SNAPSHOTS = HERE / "snapshots"
UPDATE = os.environ.get("SPECCHAT_UPDATE_SNAPSHOTS") == "1"


def check(name: str, svg: str, tmp_path: Path) -> None:
    baseline = SNAPSHOTS / f"{name}.svg"
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        baseline.write_text(svg, encoding="utf-8")
        return
    if not baseline.exists():
        pytest.fail(f"no baseline {baseline}; run with SPECCHAT_UPDATE_SNAPSHOTS=1 to create it")
    if baseline.read_text(encoding="utf-8") != svg:
        actual = tmp_path / f"{name}.actual.svg"
        actual.write_text(svg, encoding="utf-8")
        pytest.fail(f"{name}: the screen changed; compare {baseline} with {actual} "
                    "(SPECCHAT_UPDATE_SNAPSHOTS=1 accepts the new look)")


SIZES = {"120x40": (120, 40), "80x24": (80, 24)}
THEMES = ("dark", "light", "colourblind")


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES)
async def test_snapshot_chat(tmp_path, size, theme):
    check(f"chat-{size}-{theme}", await screenshots.scenario_chat(TRACE, size=SIZES[size], theme=theme), tmp_path)


async def test_snapshot_chat_80x24_panels_stacked(tmp_path):
    check("chat-80x24-panels", await screenshots.scenario_chat(TRACE, size=(80, 24), panels=True), tmp_path)


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", SIZES)
async def test_snapshot_compare(tmp_path, size, theme):
    check(f"compare-{size}-{theme}", await screenshots.scenario_compare(TRACE, size=SIZES[size], theme=theme),
          tmp_path)


@pytest.mark.parametrize("size", SIZES)
async def test_snapshot_teaching(tmp_path, size):
    check(f"teaching-{size}", await screenshots.scenario_teaching(TRACE, size=SIZES[size]), tmp_path)


@pytest.mark.parametrize("size", SIZES)
async def test_snapshot_settings(tmp_path, size):
    check(f"settings-{size}", await screenshots.scenario_settings(size=SIZES[size]), tmp_path)


@pytest.mark.parametrize("size", SIZES)
async def test_snapshot_block(tmp_path, size):
    """The tree panel's view of a block drafted in one pass (a block method of the registry, scripted)."""
    check(f"block-{size}", await screenshots.scenario_block(size=SIZES[size]), tmp_path)


async def test_snapshot_teaching_a_block(tmp_path):
    check("teaching-block-120x40", await screenshots.scenario_block(size=(120, 40), theme="colourblind", teach=True),
          tmp_path)
