"""The engine process waits, between steps, for a UI that has fallen far behind.

Why: on a machine with few cores the engine's OpenMP threads take every core while an answer
streams, and the event loop (reniced, so that it takes only the cycles the engine leaves) gets
about a tenth of one. A frame's layout and compositing cost 20-30 ms of CPU, so each took 0.2-0.3 s
of wall time, steps piled up meanwhile, and the next frame, with more to show, took longer still:
the chat drew nothing for 1-2 s at a time and Esc took 1.7-2.7 s to stop an answer (measured on
the 2-core dev VM, docs/history/benchmarks-sessions.md, "Session 41"). Now the UI acknowledges each
drain; when what was sent has waited more than ``LAG_S`` for one, the engine pauses between steps (up to
``MAX_WAIT_S``) so the UI has the cores to catch up, then goes on. A cancel ends the pause at once.

Measured in the chat (tmux 120x40, Esc 1.2 s into a 2,048-token EAGLE-3 answer, time until
"cancelled" shows): 2.75 / 0.35 / 2.60 s without, 0.56 / 0.76 / 0.52 s at 0.4 s of lag, 0.80 /
1.04 / 0.81 s at 0.7 s; the 250-token focus prompt streamed 6% slower at 0.4 s (means of five
alternated answers, 427 against 455 tok/s) and at 0.7 s 467 (three answers, the same hour), so
0.7 s it is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# how long sent steps may wait for the UI before the engine pauses: above the frame pacer's longest
# interval (0.3 s), so a UI that keeps up is never waited for, and above a short answer's length
LAG_S = 0.7
MAX_WAIT_S = 1.0  # the longest pause for one step (a UI that stopped draining costs no more)


class UiLag:
    """How far behind the UI is: the time of the oldest batch sent since its last acknowledgement."""

    def __init__(self, lag_s: float = LAG_S, max_wait_s: float = MAX_WAIT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lag_s = lag_s
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._cond = threading.Condition()
        self._oldest: float | None = None
        self.pauses = 0  # steps the engine waited at (for tests and measurements)

    def sent(self) -> None:
        """A batch went to the UI (the forwarding thread)."""
        with self._cond:
            if self._oldest is None:
                self._oldest = self._clock()

    def ack(self) -> None:
        """The UI took what it had (or the user acted: a cancel must not wait)."""
        with self._cond:
            self._oldest = None
            self._cond.notify_all()

    def behind(self) -> bool:
        with self._cond:
            return self._lagging()

    def wait(self) -> None:
        """Between steps (the engine thread): return at once unless the UI is more than ``lag_s``
        behind, else until it acknowledges, ``max_wait_s`` at most."""
        with self._cond:
            if not self._lagging():
                return
            self.pauses += 1
            self._cond.wait_for(lambda: self._oldest is None, timeout=self.max_wait_s)

    def _lagging(self) -> bool:  # with the lock held
        return self._oldest is not None and self._clock() - self._oldest > self.lag_s
