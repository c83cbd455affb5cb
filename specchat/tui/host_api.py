"""What the app needs of an engine host, as a Protocol both hosts implement.

Why a Protocol: the engine runs on a thread of the UI process (:class:`~specchat.tui.host.EngineHost`:
replays, scripted tests, debugging) or in a process of its own
(:class:`~specchat.tui.engine_process.ProcessHost`: a real model), and the app must not care which.
Typing the app's host by this Protocol keeps the two surfaces from drifting apart: a method one
host lacks is a failure of ``tests/tui/test_tui_host.py``, not a crash in front of a user.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from engine.config import SpecConfig
from specchat.tui.host import EngineHost, Item, JobKind, Mailbox, SessionFactory
from specchat.tui.trace import Record


class Gate(Protocol):
    """The step gate: teaching mode and replay step-through pause the engine between steps."""

    @property
    def stepping(self) -> bool: ...

    def set_stepping(self, on: bool) -> None: ...

    def release(self, steps: int = 1) -> None: ...

    def interrupt(self) -> None: ...


@runtime_checkable
class Host(Protocol):
    """Runs the session's jobs away from the event loop and hands their items to a mailbox."""

    mailbox: Mailbox
    gate: Gate
    record_path: str | None
    replay_speed: float
    ui_niced: bool

    def run(self) -> None:
        """The host's loop; the app runs it on a thread worker for its whole life."""

    def submit(self, kind: JobKind, text: str = "", records: Sequence[Record] = (),
               methods: tuple[str, ...] = ()) -> int:
        """Queue a job; ``methods``: a compare's method A and method B."""

    def cancel(self) -> None: ...

    def update_config(self, config: SpecConfig) -> bool:
        """Raises ConfigError if the session refuses; True when an idle session applied it at once."""

    def set_precision(self, precision: str) -> bool:
        """Raises ConfigError if the session refuses; True when it switched at once."""

    def set_record_path(self, path: str | None, records: Sequence[Record] = ()) -> None: ...

    def drain(self) -> list[Item]: ...

    def shutdown(self) -> None: ...


def make_host(factory: SessionFactory | None, wake: Callable[[], object], *, process: bool,
              record_path: str | None, replay_speed: float, ui_thread: int, ui_nice: int) -> Host:
    """A process host when asked and there is a session to load, else a thread host.

    The event loop yields the CPU only to an engine process (see host.lower_priority): a thread host
    (replays, scripted tests, SPECCHAT_ENGINE_PROCESS=0 for debugging) keeps its priority, so a test
    process or a replay is not left with a lowered priority for no engine.
    """
    if process and factory is not None:
        from specchat.tui.engine_process import ProcessHost

        return ProcessHost(factory, wake, record_path=record_path, replay_speed=replay_speed,
                           ui_thread=ui_thread, ui_nice=ui_nice)
    return EngineHost(factory, wake, record_path=record_path, replay_speed=replay_speed, ui_thread=ui_thread)
