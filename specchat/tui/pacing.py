"""How often the UI shows what the engine produced: as often as it can afford, and no more.

Why: on a machine with few cores the event loop's CPU time (layout, rendering) is taken from the
engine's threads, and every matrix product ends in an OpenMP barrier that waits for the slowest
thread, so the engine loses more than the UI takes. Measured on the 2-core dev VM with a 128-token
answer: drawing 20 frames a second kept the event loop busy ~40% of a core and the TUI streamed at
0.6x the engine's headless speed. A fixed rate is wrong both ways (a big terminal costs more per
frame, a machine with more cores can afford more), so the pacer measures the event loop's own CPU
time per frame and spaces frames so that it stays under ``budget`` of one core: at 0.15, a frame
that costs 5 ms is drawn every 50 ms at most (the 20 fps cap), one that costs 25 ms every 167 ms,
and never less often than ``max_interval`` (a quarter of a core measured worse for the engine).

The cost is the median of the last ``FRAMES_KEPT`` frames, not a running average: a frame that
mounts widgets (the model loaded, a new message sent) costs 10-20 times a streaming one, and the
average it inflated spaced the next answer's frames at ``max_interval``, about three a second.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

FRAMES_KEPT = 5  # the frames whose median CPU cost the pacer spaces frames by


class FramePacer:
    def __init__(self, *, min_interval: float = 1 / 20, max_interval: float = 0.3, budget: float = 0.15,
                 clock: Callable[[], float] = time.monotonic, cpu: Callable[[], float] = time.thread_time) -> None:
        self.min_interval = min_interval
        self.max_interval = max_interval
        self.budget = budget
        self._clock = clock
        self._cpu = cpu  # CPU seconds of the calling (event-loop) thread
        self._last_wall: float | None = None
        self._last_cpu = 0.0
        self._costs: deque[float] = deque(maxlen=FRAMES_KEPT)
        self.frame_cost = 0.0  # the event loop's CPU seconds per frame: the median of the last few

    @property
    def interval(self) -> float:
        """Seconds to leave between two frames."""
        return min(self.max_interval, max(self.min_interval, self.frame_cost / self.budget))

    def wait(self) -> float:
        """Seconds until the next frame may be drawn (0: now)."""
        if self._last_wall is None:
            return 0.0
        return max(0.0, self._last_wall + self.interval - self._clock())

    def begin(self) -> None:
        """A frame starts (the UI takes what the engine produced)."""
        self._last_wall, self._last_cpu = self._clock(), self._cpu()

    def end(self) -> None:
        """The frame is on screen (called after the refresh): its CPU cost, layout and rendering included."""
        if self._last_wall is None:
            return
        self._costs.append(max(0.0, self._cpu() - self._last_cpu))
        self.frame_cost = statistics.median(self._costs)


class Stoppable(Protocol):
    def stop(self) -> object: ...


class FrameClock:
    """Turns the engine's wake-ups into frames at the pacer's pace.

    A wake-up draws at once when the pacer allows it or something urgent waits (an answer ended,
    the engine paused, the model loaded); otherwise one timer draws when the next frame is due, and
    wake-ups until then fold into that frame. ``set_timer`` is the event loop's (Textual's).
    """

    def __init__(self, pacer: FramePacer, set_timer: Callable[[float, Callable[[], None]], Stoppable],
                 draw: Callable[[], None]) -> None:
        self.pacer = pacer
        self._set_timer = set_timer
        self._draw = draw
        self._timer: Stoppable | None = None

    def wake(self, urgent: bool) -> None:
        wait = 0.0 if urgent else self.pacer.wait()
        if wait > 0:
            if self._timer is None:
                self._timer = self._set_timer(wait, self._on_time)
            return
        if self._timer is not None:  # an urgent item overtakes the frame pacing
            self._timer.stop()
            self._timer = None
        self._draw()

    def _on_time(self) -> None:
        self._timer = None
        self._draw()
