"""What the app and an engine host say to each other: the jobs, the items, and two Protocols.

Why here, apart from the hosts: the engine runs on a thread of the UI process
(:class:`~specchat.tui.host.EngineHost`: replays, scripted tests, debugging) or in a process of its
own (:class:`~specchat.tui.engine_process.ProcessHost`: a real model), over a real session
(engine.session.Session) or a scripted one (:class:`~specchat.tui.scripted.ScriptedSession`), and
the app must not care which. :class:`Host` is what the app needs of a host, :class:`HostedSession`
what a host needs of a session; ``tests/tui/test_host_api.py`` checks that each implementation has
every member with a compatible signature, so the surfaces cannot drift apart unnoticed.

A job is one small frozen dataclass per kind, so the host dispatches on its type (a ``match`` a
type checker sees through) and each job carries only what it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol, runtime_checkable

from engine.api import Message, SessionAPI
from engine.config import SpecConfig
from specchat.tui.trace import Record

# "baseline": plain decoding; "spec": method B of a compare (the method in force by default);
# "alt": method A when it is speculative too (compare any two methods, issue 21)
Lane = Literal["chat", "baseline", "spec", "alt"]
ProgressFn = Callable[[str, int, int], None]


@runtime_checkable
class HostedSession(SessionAPI, Protocol):
    """What a host needs of a session: the engine's SessionAPI, and what the app adds on top of it
    (the methods it can run, precision switches, reopening a saved conversation, compare's rewind)."""

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods this session can run (the settings menu offers these)."""

    @property
    def precision(self) -> str:
        """The target's arithmetic in force ("exact" or "fast")."""

    def check_precision(self, precision: str) -> None:
        """Raise ConfigError (one line) where this session cannot run ``precision``."""

    def reread(self) -> None:
        """After a precision switch: read the conversation again, before the next answer is timed."""

    def restore(self, messages: list[Message], answers: Sequence[Sequence[int] | None] | None = None) -> None:
        """Go on from a saved conversation (its messages and, where recorded, each answer's ids)."""

    def rewind_cache(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (a compare's runs start from one state)."""

    def warm_up(self) -> None:
        """Pay the first answer's one-time costs now, leaving a fresh session (Session.warm_up)."""


SessionFactory = Callable[[ProgressFn], HostedSession]


# jobs: what the UI asks the engine to do ---------------------------------------------------------
JobKind = Literal["chat", "compare", "replay", "restore", "reset", "reread", "warm"]
HOST_JOB = 0  # the host's own jobs (a warm-up, a re-read): the UI numbers its jobs from 1


@dataclass(frozen=True)
class _Numbered:
    id: int = field(default=0, kw_only=True)  # given by the host that queues it (submit)


@dataclass(frozen=True)
class ChatJob(_Numbered):
    """Answer ``text`` as the next turn of the conversation."""

    kind: ClassVar[JobKind] = "chat"
    text: str


@dataclass(frozen=True)
class CompareJob(_Numbered):
    """Answer ``text`` with method A and method B, each timed alone; ``methods`` empty: the baseline
    against the method in force. ``given``: the knobs the user set, which every run keeps (the others
    take each method's own defaults, as a switch to it would)."""

    kind: ClassVar[JobKind] = "compare"
    text: str
    methods: tuple[str, ...] = ()
    given: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ReplayJob(_Numbered):
    """Play recorded records with their original pacing (the host's ``replay_speed``)."""

    kind: ClassVar[JobKind] = "replay"
    records: Sequence[Record]


@dataclass(frozen=True)
class RestoreJob(_Numbered):
    """Reopen a saved conversation: the session goes on from it, the UI shows its turns."""

    kind: ClassVar[JobKind] = "restore"
    records: Sequence[Record]


@dataclass(frozen=True)
class ResetJob(_Numbered):
    """A new conversation."""

    kind: ClassVar[JobKind] = "reset"


@dataclass(frozen=True)
class RereadJob(_Numbered):
    """After a precision switch: the conversation read again in the new arithmetic."""

    kind: ClassVar[JobKind] = "reread"


@dataclass(frozen=True)
class WarmJob(_Numbered):
    """After the load, while the user types: the first answer's one-time costs paid (Session.warm_up)."""

    kind: ClassVar[JobKind] = "warm"


Job = ChatJob | CompareJob | ReplayJob | RestoreJob | ResetJob | RereadJob | WarmJob


# items: what the UI receives ---------------------------------------------------------------------
@dataclass(frozen=True)
class LoadProgress:
    stage: str
    done: int
    total: int


@dataclass(frozen=True)
class Loaded:
    model_name: str
    config: SpecConfig | None
    methods: tuple[str, ...] = ()  # the methods this session can run (the settings menu offers these)


@dataclass(frozen=True)
class LoadFailed:
    message: str


@dataclass(frozen=True)
class Delivery:
    """One record from the engine, tagged with the pane it belongs to."""

    job: int
    lane: Lane
    record: Record


@dataclass(frozen=True)
class JobDone:
    job: int
    kind: JobKind
    error: str = ""


@dataclass(frozen=True)
class GateWaiting:
    """The engine paused at a step boundary (teaching / step-through) and waits for 'next'."""

    job: int


@dataclass(frozen=True)
class SaveFailed:
    """The conversation could not be written to ``path`` (a full disk, a removed folder): said once per file.
    The chat goes on, in memory; nothing more is written to that file."""

    path: str
    reason: str

    def message(self) -> str:
        return (f"could not save the conversation to {self.path} ({self.reason}); it goes on in memory only: "
                "export it (Ctrl+E) once there is room")


Item = LoadProgress | Loaded | LoadFailed | Delivery | JobDone | GateWaiting | SaveFailed


# the host, as the app sees it --------------------------------------------------------------------
class Gate(Protocol):
    """The step gate: teaching mode and replay step-through pause the engine between steps."""

    @property
    def stepping(self) -> bool: ...

    def set_stepping(self, on: bool) -> None: ...

    def release(self, steps: int = 1) -> None: ...

    def interrupt(self) -> None: ...


class Inbox(Protocol):
    """What the app reads of a host's mailbox (host.Mailbox) besides draining it through the host."""

    @property
    def urgent(self) -> bool:
        """Something other than a delivery is waiting (the app draws it without waiting for a frame)."""


@runtime_checkable
class Host(Protocol):
    """Runs the session's jobs away from the event loop and hands their items to a mailbox."""

    mailbox: Inbox
    gate: Gate
    record_path: str | None
    replay_speed: float
    ui_niced: bool

    def run(self) -> None:
        """The host's loop; the app runs it on a thread worker for its whole life."""

    def submit(self, job: Job) -> int:
        """Queue ``job``, numbered; returns its number (the ``job`` of its items)."""

    def cancel(self) -> None: ...

    def update_config(self, config: SpecConfig) -> bool:
        """Raises ConfigError if the session refuses; True when an idle session applied it at once."""

    def set_precision(self, precision: str) -> bool:
        """Raises ConfigError if the session refuses; True when it switched at once."""

    def set_record_path(self, path: str | None, records: Sequence[Record] = ()) -> None: ...

    def drain(self) -> list[Item]: ...

    def shutdown(self) -> None: ...
