"""Frame pacing (pacing.py) and repaints without layout (widgets/repaint.py)."""

from __future__ import annotations

from textual.app import App
from textual.containers import VerticalScroll

from specchat.tui.pacing import FrameClock, FramePacer
from specchat.tui.widgets.repaint import repaint
from specchat.tui.widgets.token_stream import TokenStream


class FakeTime:
    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 5.0


def pacer(t: FakeTime, **kw) -> FramePacer:
    return FramePacer(clock=lambda: t.wall, cpu=lambda: t.cpu, **kw)


def frame(p: FramePacer, t: FakeTime, cost: float) -> None:
    p.begin()
    t.cpu += cost
    t.wall += cost
    p.end()


def test_cheap_frames_run_at_the_cap_and_costly_ones_are_spaced_to_the_budget():
    t = FakeTime()
    p = pacer(t, min_interval=0.05, max_interval=0.3, budget=0.25)
    assert p.wait() == 0.0  # nothing drawn yet: draw now
    for _ in range(10):
        frame(p, t, 0.002)
    assert p.interval == 0.05
    for _ in range(30):
        frame(p, t, 0.025)
    assert abs(p.interval - 0.1) < 1e-3  # 25 ms per frame at a quarter of a core
    for _ in range(30):
        frame(p, t, 0.2)
    assert p.interval == 0.3  # never slower than max_interval


def test_one_costly_frame_does_not_space_out_the_next_ones():
    """A frame that mounts widgets (the model loaded, a message sent) costs 10-20 streaming frames:
    the frames after it keep the streaming pace (a running average stretched them to
    max_interval, three frames a second, for the whole next answer)."""
    t = FakeTime()
    p = pacer(t, min_interval=0.05, max_interval=0.3, budget=0.15)
    for _ in range(5):
        frame(p, t, 0.006)
    frame(p, t, 0.240)
    frame(p, t, 0.006)
    assert p.interval == 0.05
    for _ in range(3):  # costly frames that persist do count
        frame(p, t, 0.030)
    assert abs(p.interval - 0.2) < 1e-3


def test_wait_counts_from_the_last_frame():
    t = FakeTime()
    p = pacer(t, min_interval=0.05, budget=0.25)
    frame(p, t, 0.025)
    assert 0.0 < p.wait() <= 0.1
    t.wall += 1.0
    assert p.wait() == 0.0


class StreamApp(App):
    def compose(self):
        with VerticalScroll():
            yield TokenStream()


async def test_a_stream_that_keeps_its_height_repaints_without_a_layout():
    app = StreamApp()
    async with app.run_test(size=(40, 10)) as pilot:
        stream = app.query_one(TokenStream)
        stream.add_text("hello")
        await pilot.pause()
        stream.pieces.append((" world", "target"))
        repaint(stream)
        assert not stream._layout_required  # same one line: a repaint only
        await pilot.pause()
        stream.pieces.append((" and a much longer tail that wraps onto another line", "target"))
        repaint(stream)
        assert stream._layout_required  # taller: the screen lays out again
        await pilot.pause()
        assert stream.size.height == 2


def test_the_app_skips_the_ansi_to_truecolor_filter_but_keeps_no_color(monkeypatch) -> None:
    """Our themes use no ANSI colours, so converting them on every strip of every frame is waste
    (a third of a frame's CPU at 120x40); NO_COLOR's monochrome filter must still apply."""
    from textual.filter import ANSIToTruecolor, Monochrome, NoColor

    from specchat.tui.headless import make_app

    app = make_app()
    assert any(isinstance(f, ANSIToTruecolor) for f in app._filters)  # Textual adds it ...
    assert not any(isinstance(f, ANSIToTruecolor) for f in app.get_line_filters())  # ... we skip it
    monkeypatch.setenv("NO_COLOR", "1")
    assert any(isinstance(f, (Monochrome, NoColor)) for f in make_app().get_line_filters())


class FakeTimers:
    """Stands in for the event loop's ``set_timer``: timers fire only when the test says so."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, object]] = []
        self.stopped = 0

    def set_timer(self, delay: float, callback):
        timers = self

        class Timer:
            def stop(self) -> None:
                timers.stopped += 1
                timers.pending.remove(entry)

        entry = (delay, callback)
        self.pending.append(entry)
        return Timer()

    def fire(self) -> None:
        _, callback = self.pending.pop(0)
        callback()


def test_wake_ups_between_frames_fold_into_one_and_urgent_items_overtake_the_pacing():
    t, timers, drawn = FakeTime(), FakeTimers(), []
    p = pacer(t, min_interval=0.05)
    clock = FrameClock(p, timers.set_timer, lambda: (drawn.append(t.wall), p.begin()))
    clock.wake(urgent=False)
    assert len(drawn) == 1 and not timers.pending, "the first frame is drawn at once"
    clock.wake(urgent=False)
    clock.wake(urgent=False)
    assert len(drawn) == 1 and len(timers.pending) == 1, "two wake-ups, one timer"
    timers.fire()
    assert len(drawn) == 2
    clock.wake(urgent=False)
    clock.wake(urgent=True)
    assert len(drawn) == 3 and timers.stopped == 1 and not timers.pending, "urgent: drawn now, timer stopped"
