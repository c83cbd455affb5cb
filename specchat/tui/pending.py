"""A change asked for while a job runs, applied when it ends: the one object that holds one.

Why one object: three layers defer a change. The host holds a precision switch until its job ends
(a compare's runs share one arithmetic); the scripted session holds hot-swapped settings until the
next step and a precision until its answer ends, as the engine's session does; the UI shows what
is pending until the engine says it is in force. Each kept its own pair of attributes and its own
copy of the rules; they live here now, once, with the lock that makes them safe across threads
(asked for on the UI's thread, taken on the engine's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def _nothing(_: object) -> None:
    pass


class PendingChange(Generic[T]):
    """The value in force and a change to it held while a job runs.

    ``on_change(value)`` runs, under the lock, each time a value comes into force (at once, at a
    step boundary or when the job ends), before it is recorded: if it raises, nothing changed.
    """

    def __init__(self, value: T, on_change: Callable[[T], None] = _nothing) -> None:
        self._lock = threading.Lock()
        self._value = value
        self._pending: T | None = None
        self._busy = False
        self._on_change = on_change

    @property
    def value(self) -> T:
        """In force."""
        return self._value

    @property
    def pending(self) -> T | None:
        """Asked for and accepted, not in force yet (None when nothing waits)."""
        return self._pending

    @property
    def wanted(self) -> T:
        """What will be in force once nothing waits: the pending change, else the value."""
        pending = self._pending
        return self._value if pending is None else pending

    def begin(self) -> None:
        """A job starts: a change asked for from now on waits."""
        with self._lock:
            self._busy = True

    def ask(self, value: T) -> bool:
        """``value`` in force at once when no job runs (True); else held until it ends (False)."""
        with self._lock:
            if self._busy:
                self._pending = value
                return False
            self._put(value)
            return True

    def take(self) -> T | None:
        """The held change, in force now (at a step boundary); None when none was held."""
        with self._lock:
            return self._take()

    def end(self) -> T | None:
        """The job ended: the held change, if any, is in force now and returned."""
        with self._lock:
            self._busy = False
            return self._take()

    # the UI's copy: the host answers whether a change waited, the engine reports what is in force
    def hold(self, value: T) -> None:
        """Show ``value`` as pending (the host holds it); asking for the value in force drops it."""
        with self._lock:
            self._pending = None if value == self._value else value

    def settle(self, value: T) -> bool:
        """The engine reports ``value`` in force; True when that was the pending change."""
        with self._lock:
            self._value = value
            done = self._pending is not None and self._pending == value
            if done:
                self._pending = None
            return done

    def _take(self) -> T | None:
        pending, self._pending = self._pending, None  # a change that fails to apply is dropped, not retried
        if pending is not None:
            self._put(pending)
        return pending

    def _put(self, value: T) -> None:
        self._on_change(value)
        self._value, self._pending = value, None
