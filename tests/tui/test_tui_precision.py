"""The precision setting (F2's precision row, the palette's ``precision fast``): the target's
arithmetic switched while chatting; the title says which one is in force, a switch asked for
while an answer streams waits for that job to end, and a refused value keeps the old one."""

from __future__ import annotations

from engine.events import Started
from specchat.tui.headless import make_app, make_session, wait_idle, wait_loaded, wait_until
from specchat.tui.host import EngineHost, wait_items
from specchat.tui.host_api import HOST_JOB, CompareJob, Delivery, JobDone, Loaded
from specchat.tui.widgets.title_bar import TitleBar
from tests.tui.helpers import palette, send

SIZE = (120, 40)


def title(app) -> str:
    return str(app.screen.query_one(TitleBar).render())


async def test_the_palette_switches_the_precision_and_the_title_follows():
    session = make_session()
    app = make_app(session, precision="exact")
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        assert "fast precision" not in title(app)
        await palette(pilot, "precision fast", "Set precision = fast")
        await wait_until(pilot, lambda: session.precision == "fast", what="switched")
        await pilot.pause()
        assert "fast precision" in title(app) and app.settings_control.precision.value == "fast"
        await send(pilot, "one")
        await wait_idle(pilot)
        assert app.settings_control.precision.value == "fast"  # the answer's Started reported it


async def test_the_settings_panel_has_a_precision_row_that_switches_it():
    session = make_session(precision="fast")
    app = make_app(session, precision="fast")
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        assert "fast precision" in title(app)
        await pilot.press("f2")
        await pilot.pause()
        select = app.chat_screen.settings.query_one("#set-precision")
        assert select.value == "fast"
        select.value = "exact"  # what choosing it from the drop-down does
        await wait_until(pilot, lambda: session.precision == "exact", what="switched")
        await pilot.pause()
        assert "fast precision" not in title(app) and select.value == "exact"


async def test_a_switch_asked_for_during_an_answer_waits_for_the_job_to_end():
    session = make_session(step_delay=0.05)
    app = make_app(session, precision="exact")
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "one")
        await wait_until(pilot, lambda: app.chat_screen.answer is not None, what="streaming")
        assert app.apply_setting("precision", "fast") is None
        assert session.precision == "exact" and app.settings_control.precision.pending == "fast"
        assert "fast precision" not in title(app)  # the title shows what is in force
        session.step_delay = 0
        await wait_idle(pilot)
        assert session.precision == "fast" and app.settings_control.precision.value == "fast"
        await pilot.pause()
        assert "fast precision" in title(app)


async def test_a_refused_precision_keeps_the_one_in_force():
    session = make_session()
    app = make_app(session, precision="exact")
    async with app.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        assert "precision must be one of exact, fast" in app.apply_setting("precision", "fp8")
        assert session.precision == "exact" and app.settings_control.precision.value == "exact"


def test_the_host_holds_a_switch_until_the_running_job_ends():
    """A compare's two runs are one job: both run in one precision, whatever is asked meanwhile."""
    import threading

    session = make_session(step_delay=0.02)
    host = EngineHost(lambda progress: session, lambda: None)
    worker = threading.Thread(target=host.run, daemon=True)
    worker.start()
    seen: list = []

    def until(check):
        return lambda items: check(seen + items)

    try:
        seen += wait_items(host, until(lambda items: any(isinstance(i, Loaded) for i in items)))
        job = host.submit(CompareJob("hello", ("none", "ngram")))
        seen += wait_items(host, until(lambda items: any(isinstance(i, Delivery) for i in items)))
        assert host.set_precision("fast") is False and session.precision == "exact"
        seen += wait_items(host, until(lambda items: any(isinstance(i, JobDone) and i.kind == "reread"
                                                         for i in items)))
        done = [(i.job, i.kind) for i in seen if isinstance(i, JobDone)]
        assert done == [(HOST_JOB, "warm"), (job, "compare"), (HOST_JOB, "reread")]  # switched, then read again
        started = [i.record for i in seen if isinstance(i, Delivery) and isinstance(i.record, Started)]
        assert len(started) == 2 and {s.precision for s in started} == {"exact"}
        assert session.precision == "fast"
        assert host.set_precision("exact") is True and session.precision == "exact"
    finally:
        host.shutdown()


async def test_a_recording_keeps_its_precision_and_its_replay_shows_it(tmp_path):
    """``Started.precision`` goes into the trace; a replay's title says which arithmetic ran, and a
    replay has no engine to switch."""
    from specchat.tui.headless import replay_app
    from specchat.tui.trace import read_trace

    path = tmp_path / "rec.jsonl"
    session = make_session(precision="fast")
    live = make_app(session, precision="fast", record=str(path))
    async with live.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await send(pilot, "first")
        await wait_idle(pilot)
    assert [r.precision for r in read_trace(path)[1] if isinstance(r, Started)] == ["fast"]
    replay = replay_app(path)
    async with replay.run_test(size=SIZE) as pilot:
        await wait_loaded(pilot)
        await wait_idle(pilot)
        assert "fast precision" in title(replay)
        assert "replay" in replay.apply_setting("precision", "exact")
