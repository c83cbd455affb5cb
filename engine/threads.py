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
aborted trial's time), it runs a trial: a window of pairs, one step at each count in turn, so that
the machine's drift falls on both alike, and keeps one thread only where it ran at least 10% faster
pair by pair. A trial ends at once at its second step at all threads twice as slow as one thread's.
The first window at all threads is followed by a trial, since a core may be taken from the start.
Measured in the TUI with the training job beside it: 72 and 89 tok/s on two answers (7 before; 135
with ``--threads 1``). The threads only split independent output columns and attention rows, so
the logits do not depend on the thread count (tests/test_attention.py, tests/test_threads.py): a
switch never changes an answer.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

_WINDOW = 8  # steps judged together
_SLOW = 3.0  # a window this many times the quiet step time means a core is taken
_RETRY, _MAX_WAIT = 32, 512  # steps on one thread before all threads are tried again
_ABORT = 2.0  # the second step of a trial at all threads this many times one thread's ends the trial
_TRIAL_SHARE = 20.0  # after an aborted trial, run this many times its cost on one thread first
# one thread is kept after a trial only where it ran this much faster, pair by pair: a wrong drop
# costs a quiet machine a third of its speed for a wait (the 1.5B model: 27-31 tok/s on one thread,
# 35-52 on two, session 51), a wrong keep under a taken core shows in the next window (_SLOW)
_ONE_WINS = 1.1
# one step at all threads this many times the quiet step time drops to one thread at once, without
# waiting for a window: beside a 2-thread job the chat's steps took 2.7 s against 5-10 ms quiet
# (session 50), and a window of 8 such steps kept it at 0.4 tok/s for 20 s; a wrong drop costs
# one trial's wait on one thread, a late one seconds a step
_STALL = 20.0
# the first exploration: a window at all threads, then a trial of a window's pairs
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
    reduced_ms: float | None = None  # the median step on one thread, when last measured
    explored: bool = False  # one thread has been measured
    wait: int = 0  # steps left on one thread before all threads are tried again
    owed_ms: float = 0.0  # and ms left to run on one thread before then (20x the last aborted trial)
    next_wait: int = _RETRY
    trial: list[tuple[int, float]] | None = None  # the trial under way: (threads, normalised ms) a step

    def __post_init__(self) -> None:
        self.current = self.full

    @property
    def explored_first(self) -> bool:
        """Whether the first exploration (a window at all threads, then a trial) is over."""
        return self.explored and self.trial is None

    def observe(self, ms: float, relative: float = 1.0) -> None:
        """A step took ``ms``; ``relative``: its tree's verify cost relative to one token's."""
        norm = ms / max(relative, 1e-6)
        if self.trial is not None:
            self._in_trial(norm, ms)
            return
        self.recent.append(norm)
        if self.current == self.full:
            self._at_full(norm)
        else:
            self.owed_ms -= ms
            self._at_one()

    def _at_full(self, norm: float) -> None:
        if self.quiet_ms is not None and norm > _STALL * self.quiet_ms:
            self._drop()
            return
        self.history.append(norm)
        if len(self.history) >= _WINDOW:
            quartile = statistics.quantiles(self.history, n=4)[0]
            self.quiet_ms = quartile if self.quiet_ms is None else min(self.quiet_ms * 1.02, quartile)
        if len(self.recent) < _WINDOW:
            return
        if not self.explored:  # a trial early on: a core may be taken from the start,
            self.explored = True  # and then no step at all threads ever looks quiet
            self._start_trial()
        elif self.quiet_ms is not None and statistics.median(self.recent) > _SLOW * self.quiet_ms:
            self._drop()  # a core was taken

    def _at_one(self) -> None:
        self.wait -= 1
        if self.wait > 0 or self.owed_ms > 0:
            return
        if self.recent:
            self.reduced_ms = statistics.median(self.recent)
        self.next_wait = min(_MAX_WAIT, 2 * self.next_wait)
        self._start_trial()

    def _start_trial(self) -> None:
        """Alternate the two counts step by step for a window of pairs, starting with the one not in
        force. Why pairs: this VM's speed flips by a third between moments (issue 57), and a window
        on one thread followed by one on all threads compared two machine states, not two thread
        counts: on a quiet machine it kept one thread for half of an answer (session 51)."""
        self.trial = []
        self._switch(1 if self.current == self.full else self.full)

    def _in_trial(self, norm: float, ms: float) -> None:
        trial = self.trial
        assert trial is not None
        trial.append((self.current, norm))
        if self.current == self.full and self._trial_failing(trial, norm):
            # a core is taken: the trial ends at once (seen in the TUI: one such step took 1-2 s),
            # and the next waits until one thread has run 20 times as long, so trials cost at most
            # ~5% of the time
            self.trial = None
            self._drop()
            self.owed_ms = _TRIAL_SHARE * ms
            return
        if len(trial) < 2 * _WINDOW:
            self._switch(1 if self.current == self.full else self.full)
            return
        self.trial = None
        at_full = [n for t, n in trial if t == self.full]
        at_one = [n for t, n in trial if t != self.full]
        ratios = [full / max(one, 1e-9) for full, one in zip(at_full, at_one, strict=True)]
        if statistics.median(ratios) > _ONE_WINS:
            self.reduced_ms = statistics.median(at_one)
            self._drop()
        else:
            self.next_wait, self.reduced_ms = _RETRY, None
            self._switch(self.full)

    def _trial_failing(self, trial: list[tuple[int, float]], norm: float) -> bool:
        """Whether a trial's step at all threads (``norm``) ends it: a stall (against the quiet step
        time, or one thread's where all threads never ran quiet: a session that started on one
        thread beside a busy program, whose first step at all threads took 700 ms against 3.7),
        or the second step twice one thread's (one alone may be a hiccup: a 59 ms step among 24 ms
        ones, session 51)."""
        ones = [n for t, n in trial if t != self.full]
        one_ms = statistics.median(ones) if ones else self.reduced_ms
        quiet = self.quiet_ms if self.quiet_ms is not None else one_ms
        if quiet is not None and norm > _STALL * quiet:
            return True
        if one_ms is None:
            return False
        return sum(1 for t, n in trial if t == self.full and n > _ABORT * one_ms) >= 2

    def _drop(self) -> None:
        """To one thread, until the wait is over."""
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

    def _switch(self, threads: int) -> None:
        if threads != self.current:
            self.current = threads
            self.set_threads(threads)
        self.recent.clear()
