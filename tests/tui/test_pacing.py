"""Frame pacing (pacing.py) and repaints without layout (widgets/repaint.py)."""

from __future__ import annotations

from textual.app import App
from textual.containers import VerticalScroll

from specchat.tui.pacing import FramePacer
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

    from specchat.tui.testing import make_app

    app = make_app()
    assert any(isinstance(f, ANSIToTruecolor) for f in app._filters)  # Textual adds it ...
    assert not any(isinstance(f, ANSIToTruecolor) for f in app.get_line_filters())  # ... we skip it
    monkeypatch.setenv("NO_COLOR", "1")
    assert any(isinstance(f, (Monochrome, NoColor)) for f in make_app().get_line_filters())
