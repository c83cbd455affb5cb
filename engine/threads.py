"""Fewer CPU threads while another program holds a core, all of them again once it lets go.

Why: a forward is ~120 matrix products, each ending in a barrier of all OpenMP threads. When
another runnable program takes one of the cores, every barrier waits a scheduler slice for the
thread it displaced. Measured in the TUI on the 2-core EPYC with a training job running beside it
(one thread, nice 19, but in another session's autogroup, so the nice value does not help): **7
tok/s with 2 threads, 135 with 1**, and ~150-180 with 2 on a quiet machine. Nobody can be asked to
know that before they start a chat, and the other program may start or stop mid-answer, so the
session watches its own steps.

:class:`ThreadGovernor` keeps the time of a one-token step at full threads while things are quiet
(the lower quartile of the recent steps, each normalised by the tree's relative verify cost).
When the steps of the last window run at several times that, it drops to one thread (at once,
without a window, for one step twenty times that: a stall, seconds a step); after 32
steps, then 64, ... 512 while one thread keeps being the faster (and after 20 times the last
failed trial's time), it tries all threads again for a window, ended at its first step if that
step is twice as slow as one thread's. The first window at all threads is followed by one on one
thread, since a core may be taken from the start. Measured in the TUI with the training job
beside it: 72 and 89 tok/s on two answers (7 before; 135 with ``--threads 1``). The threads only
split independent output columns and attention rows, so the logits do not depend on the thread
count (tests/test_attention.py, tests/test_threads.py): a switch never changes an answer.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

_WINDOW = 8  # steps judged together
_SLOW = 3.0  # a window this many times the quiet step time means a core is taken
_RETRY, _MAX_WAIT = 32, 512  # steps on one thread before all threads are tried again
_ABORT = 2.0  # a step at all threads this many times one thread's ends their trial at once
_TRIAL_SHARE = 20.0  # after a failed trial, run this many times its cost on one thread first
# one step at all threads this many times the quiet step time drops to one thread at once, without
# waiting for a window: beside a 2-thread job the chat's steps took 2.7 s against 5-10 ms quiet
# (session 50), and a window of 8 such steps kept it at 0.4 tok/s for 20 s; a wrong drop costs
# one window on one thread, a late one seconds a step
_STALL = 20.0
# the first exploration: a window at all threads, one on one thread, one at all threads again
# (Session.warm_up runs that many plain steps, so a chat's first answer does not pay for it)
EXPLORE_STEPS = 3 * _WINDOW


@dataclass
class ThreadGovernor:
    """Picks the thread count for the next step from the last steps' times (see the module docstring)."""

    full: int  # the thread count when the machine is quiet
    set_threads: Callable[[int], None]
    current: int = 0
    quiet_ms: float | None = None  # normalised ms of a step at full threads on a quiet machine
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=_WINDOW))
    history: deque[float] = field(default_factory=lambda: deque(maxlen=4 * _WINDOW))  # at full threads
    reduced_ms: float | None = None  # the window's median on one thread, when last measured
    explored: bool = False  # one thread has been measured
    wait: int = 0  # steps left on one thread before all threads are tried again
    owed_ms: float = 0.0  # and ms left to run on one thread before then (20x the last failed trial)
    next_wait: int = _RETRY

    def __post_init__(self) -> None:
        self.current = self.full

    def observe(self, ms: float, relative: float = 1.0) -> None:
        """A step took ``ms``; ``relative``: its tree's verify cost relative to one token's."""
        norm = ms / max(relative, 1e-6)
        self.recent.append(norm)
        if self.current == self.full:
            self._at_full(norm, ms)
        else:
            self.owed_ms -= ms
            self._at_one()

    def _at_full(self, norm: float, ms: float) -> None:
        if self.reduced_ms is not None and norm > _ABORT * self.reduced_ms:
            # a trial of all threads: one step this slow is verdict enough (seen in the TUI: one
            # such step took 1-2 s), and the next trial waits until one thread has run 20 times
            # as long, so trials cost at most ~5% of the time
            self._switch(1)
            self.wait, self.owed_ms = self.next_wait, _TRIAL_SHARE * ms
            return
        if self.quiet_ms is not None and norm > _STALL * self.quiet_ms:
            self._switch(1)
            self.wait = self.next_wait
            return
        self.history.append(norm)
        if len(self.history) >= _WINDOW:
            quartile = statistics.quantiles(self.history, n=4)[0]
            self.quiet_ms = quartile if self.quiet_ms is None else min(self.quiet_ms * 1.02, quartile)
        if len(self.recent) < _WINDOW:
            return
        window = statistics.median(self.recent)
        if not self.explored:  # one window on one thread early on: a core may be taken from the start,
            self.explored = True  # and then no step at all threads ever looks quiet
            self._switch(1)
            self.wait = _WINDOW
        elif self.reduced_ms is not None:  # a window at all threads after some on one: the faster stays
            if window > self.reduced_ms:
                self._switch(1)
                self.wait = self.next_wait
            else:
                self.next_wait, self.reduced_ms = _RETRY, None
        elif self.quiet_ms is not None and window > _SLOW * self.quiet_ms:  # a core was taken
            self._switch(1)
            self.wait = self.next_wait

    def start_reduced(self) -> None:
        """Begin on one thread: the caller found one thread faster before the first step (the cost
        calibration's probe, engine/calibrate.py). Why: otherwise the first window ran at all
        threads, eight steps of up to 1-2 s each beside a busy program (the TUI's first answer at
        2.7 tok/s); all threads are tried again after the usual wait, as after a slow window."""
        self.explored = True
        self._switch(1)
        self.wait = self.next_wait

    def _at_one(self) -> None:
        self.wait -= 1
        if self.wait > 0 or self.owed_ms > 0 or len(self.recent) < _WINDOW:
            return
        self.reduced_ms = statistics.median(self.recent)
        self.next_wait = min(_MAX_WAIT, 2 * self.next_wait)
        self._switch(self.full)  # a window at all threads: kept if it beats one thread

    def _switch(self, threads: int) -> None:
        self.current = threads
        self.set_threads(threads)
        self.recent.clear()
