"""The engine in its own process: :class:`ProcessHost` has the surface of :class:`EngineHost`.

Why a process: the engine's step loop is Python between native kernels, so in one process it
needs the GIL hundreds of times per token, and the event loop holds the GIL while it lays out
and renders a frame. On the 2-core dev VM that cost the TUI 15-25% of the engine's headless speed
even with cheap frames (issue 10 wants 15% at most). In its own process the engine never waits for
the UI's Python; the UI process runs at a lower CPU priority (``ui_nice``), so it takes the
cycles the engine leaves and gets every core back when the engine is idle.

The child runs an ordinary :class:`EngineHost` (load, jobs, gate, recording) plus two threads:
one forwards the mailbox's items to the parent in batches, one carries out commands (submit,
cancel, settings, gate, recording). ``update_config`` and ``set_precision`` are calls with an
answer, so a refused hot-swap raises the session's own ``ConfigError`` in the UI and the old
settings stay. If the child dies, the UI is told in one line (load failed, or the running job
ended with an error).

The factory must pickle (the child is spawned, not forked: the UI process has threads).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import multiprocessing as mp
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import resource_tracker
from typing import Any

from engine.config import ConfigError, SpecConfig
from engine.events import Step
from specchat.tui.backpressure import UiLag
from specchat.tui.host import EngineHost, Mailbox, applied_at_once, lower_priority
from specchat.tui.host_api import (
    Delivery,
    Host,
    Item,
    Job,
    JobDone,
    JobKind,
    Loaded,
    LoadFailed,
    SessionFactory,
)
from specchat.tui.trace import Record


@dataclass
class SessionView:
    """What the UI reads of the session: its methods and the settings in force / pending."""

    methods: tuple[str, ...] = ()
    config: SpecConfig | None = None
    pending_config: SpecConfig | None = None
    model_name: str = ""


class _GateProxy:
    """The step gate, seen from the UI: ``stepping`` is mirrored here, changes go to the engine."""

    def __init__(self, send: Callable[..., None]) -> None:
        self._send = send
        self._stepping = False

    @property
    def stepping(self) -> bool:
        return self._stepping

    def set_stepping(self, on: bool) -> None:
        self._stepping = on
        self._send("gate_stepping", on)

    def release(self, steps: int = 1) -> None:
        self._send("gate_release", steps)

    def interrupt(self) -> None:
        self._send("gate_interrupt")


class ProcessHost:
    """The :class:`~specchat.tui.host_api.Host` surface in the UI process; the engine runs in a child."""

    def __init__(
        self,
        factory: SessionFactory,
        wake: Callable[[], object],
        *,
        record_path: str | None = None,
        replay_speed: float = 1.0,
        ui_thread: int | None = None,
        ui_nice: int = 0,
    ) -> None:
        ctx = mp.get_context("spawn")
        self.mailbox = Mailbox(wake)
        self.session = SessionView()
        self.gate = _GateProxy(self._send)
        self._record_path = record_path
        self._replay_speed = replay_speed
        self._ui_thread, self._ui_nice = ui_thread, ui_nice
        self.ui_niced = False
        self._ids = itertools.count(1)
        self._open_jobs: dict[int, JobKind] = {}
        self._lock = threading.Lock()  # the open jobs (UI thread and receiving thread)
        self._rpc_lock = threading.Lock()  # one call with an answer (update_config, set_precision) at a time
        self._items_in, items_out = ctx.Pipe(duplex=False)
        cmd_in, self._cmd_out = ctx.Pipe(duplex=False)
        self._rpc_in, rpc_out = ctx.Pipe(duplex=False)
        self._child_ends = (items_out, cmd_in, rpc_out)
        self._process = ctx.Process(target=_child_main, name="specchat-engine", daemon=True,
                                    args=(factory, record_path, replay_speed, items_out, cmd_in, rpc_out))
        self._started = False
        self._closed = False
        # spawning needs multiprocessing's resource tracker, whose start passes on sys.stderr's file
        # descriptor: start it now, before Textual replaces sys.stderr with an object that has none
        resource_tracker.ensure_running()

    # the EngineHost surface the UI uses --------------------------------------------------------
    @property
    def record_path(self) -> str | None:
        return self._record_path

    @record_path.setter
    def record_path(self, path: str | None) -> None:
        self._record_path = path
        self._send("record_path", path)

    def set_record_path(self, path: str | None, records: Sequence[Record] = ()) -> None:
        self._record_path = path
        self._send("set_record_path", path, tuple(records))

    @property
    def replay_speed(self) -> float:
        return self._replay_speed

    @replay_speed.setter
    def replay_speed(self, speed: float) -> None:
        self._replay_speed = speed
        self._send("replay_speed", speed)

    def submit(self, job: Job) -> int:
        job = dataclasses.replace(job, id=next(self._ids))
        with self._lock:
            self._open_jobs[job.id] = job.kind
        self._send("submit", job)
        return job.id

    def cancel(self) -> None:
        self._send("cancel")

    def update_config(self, config: SpecConfig) -> bool:
        """Raises the session's ConfigError if it refuses (the old settings stay), or if the engine is gone;
        True when the idle session applied it at once."""
        self.session.config, self.session.pending_config = self._call("update_config", config)
        return applied_at_once(self.session.config, self.session.pending_config, config)

    def set_precision(self, precision: str) -> bool:
        """As update_config: the session's ConfigError raised here; True when it switched at once."""
        return self._call("set_precision", precision)[0]

    def _call(self, op: str, *args: Any) -> list[Any]:
        """A command with an answer: the child's reply after "ok", or its exception raised here."""
        with self._rpc_lock:
            self._send(op, *args)
            try:
                status, *rest = self._rpc_in.recv()
            except (EOFError, OSError):
                raise ConfigError("the engine process has stopped; restart specchat") from None
        if status == "error":
            raise rest[0]
        return rest

    def drain(self) -> list[Item]:
        items = self.mailbox.drain()
        if items:
            self._send("ack")  # the engine may be waiting for a UI that fell behind (backpressure.py)
        return items

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._send("shutdown")
        if self._started:
            self._process.join(timeout=3)
            if self._process.is_alive():
                self._process.terminate()
                self._process.join(timeout=2)

    # the receiving thread (the app runs this on a thread worker) ---------------------------------
    def run(self) -> None:
        self._process.start()
        self._started = True
        for end in self._child_ends:
            end.close()
        # the child exists now (it keeps this thread's priority); the event loop yields to it
        self.ui_niced = lower_priority(self._ui_thread, self._ui_nice)
        clean = False
        try:
            while True:
                try:
                    kind, payload = self._items_in.recv()
                except (EOFError, OSError):
                    break
                if kind == "items":
                    for item in payload:
                        self._track(item)
                        self.mailbox.put(item)
                elif kind == "exit":
                    clean = True
                    break
        finally:
            if not clean and not self._closed:
                self._child_died()

    def _track(self, item: Item) -> None:
        if isinstance(item, JobDone):
            with self._lock:
                self._open_jobs.pop(item.job, None)
        elif isinstance(item, Loaded):
            self.session = SessionView(item.methods, item.config, None, item.model_name)

    def _child_died(self) -> None:
        self._process.join(timeout=1)
        why = f"the engine process stopped unexpectedly (exit code {self._process.exitcode})"
        if self.session.config is None and not self.session.model_name:
            self.mailbox.put(LoadFailed(why))
        with self._lock:
            jobs, self._open_jobs = dict(self._open_jobs), {}
        for job_id, kind in jobs.items():
            self.mailbox.put(JobDone(job_id, kind, why))

    def _send(self, op: str, *args: Any) -> None:
        if self._closed and op != "shutdown":
            return
        with contextlib.suppress(OSError, ValueError):  # the child is gone; run() reports it
            self._cmd_out.send((op, *args))


def make_host(factory: SessionFactory | None, wake: Callable[[], object], *, process: bool,
              record_path: str | None, replay_speed: float, ui_thread: int, ui_nice: int) -> Host:
    """A process host when asked and there is a session to load, else a thread host.

    The event loop yields the CPU only to an engine process (see host.lower_priority): a thread host
    (replays, scripted tests, SPECCHAT_ENGINE_PROCESS=0 for debugging) keeps its priority, so a test
    process or a replay is not left with a lowered priority for no engine.
    """
    if process and factory is not None:
        return ProcessHost(factory, wake, record_path=record_path, replay_speed=replay_speed,
                           ui_thread=ui_thread, ui_nice=ui_nice)
    return EngineHost(factory, wake, record_path=record_path, replay_speed=replay_speed, ui_thread=ui_thread)


# the child process ----------------------------------------------------------------------------
# how long the first delivery of a batch waits for company before it goes to the UI (anything else
# goes at once); the UI draws at most 20 frames a second, so it sees no later text
BATCH_S = 0.02


@dataclass
class _Forwarder:
    """Sends the mailbox's items to the parent in batches: one pipe write per batch.

    Why batches of ``BATCH_S``: a step's delivery sent at once wakes this thread and the parent's
    receiving thread for every step (hundreds a second), and on a machine with few cores each
    wake-up takes a core from one of the engine's OpenMP threads, which the others then wait for
    at their next barrier. Deliveries wait up to ``BATCH_S`` for the next ones; an urgent item (a
    job ended, the engine paused for teaching, the model loaded) sends the batch at once. Measured
    (session 41, 2-core Zen 5, the focus prompt with n-gram, alternated): the engine process
    without a UI 491.7 / 513.9 -> 519.2 / 541.2 tok/s (means of 8 answers), the chat at 120x40
    482 / 428 / 387 -> 491 / 452 / 417 (docs/history/benchmarks-sessions.md, "Session 41")."""

    conn: Any
    host: EngineHost | None = None
    wake: threading.Event = field(default_factory=threading.Event)
    stop: bool = False
    batch_s: float = BATCH_S
    lag: UiLag = field(default_factory=UiLag)

    def loop(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            if self.batch_s > 0 and not self.stop and self.host is not None and not self.host.mailbox.urgent:
                self.wake.wait(self.batch_s)  # set again only by an urgent item (Mailbox.put)
                self.wake.clear()
            stopping = self.stop  # read before draining: whatever was put before the stop goes out
            items = [_lean(i) for i in self.host.drain()] if self.host is not None else []
            if items:
                self.lag.sent()  # before the write: the UI's acknowledgement of it must come after
                self.conn.send(("items", items))
            if stopping:
                return


def _lean(item: Item) -> Item:
    """Drop what the UI never reads and would be costly to pickle: per-node proposal distributions
    (vocabulary-sized tensors kept for lossless tree sampling)."""
    if isinstance(item, Delivery) and isinstance(item.record, Step) and item.record.tree.proposals is not None:
        tree = dataclasses.replace(item.record.tree, proposals=None)
        return dataclasses.replace(item, record=dataclasses.replace(item.record, tree=tree))
    return item


def _child_main(factory: SessionFactory, record_path: str | None, replay_speed: float,
                items_out: Any, cmd_in: Any, rpc_out: Any) -> None:
    forwarder = _Forwarder(items_out)
    host = EngineHost(factory, forwarder.wake.set, record_path=record_path, replay_speed=replay_speed)
    forwarder.host = host
    host.pace = forwarder.lag.wait
    sender = threading.Thread(target=forwarder.loop, name="specchat-forward", daemon=True)
    sender.start()
    handlers = _command_handlers(host, rpc_out, forwarder.lag)
    threading.Thread(target=_obey, args=(cmd_in, host, handlers), name="specchat-commands", daemon=True).start()
    try:
        host.run()
    finally:
        forwarder.stop = True
        forwarder.wake.set()
        sender.join(timeout=2)
        with contextlib.suppress(OSError, ValueError):
            items_out.send(("exit", None))


def _command_handlers(host: EngineHost, rpc_out: Any, lag: UiLag) -> dict[str, Callable[..., object]]:
    """The parent's commands (``ProcessHost._send``'s first argument) and what each does here."""

    def cancel() -> None:
        host.cancel()
        lag.ack()  # an engine waiting for the UI stops now, not after the wait

    def update_config(config: SpecConfig) -> None:
        try:
            host.update_config(config)
            rpc_out.send(("ok", host.session.config, host.session.pending_config))
        except Exception as exc:  # the session's ConfigError, raised again in the UI
            rpc_out.send(("error", exc))

    def set_precision(precision: str) -> None:
        try:
            rpc_out.send(("ok", host.set_precision(precision)))
        except Exception as exc:
            rpc_out.send(("error", exc))

    return {
        "submit": host.enqueue,  # the parent numbers the jobs
        "cancel": cancel,
        "ack": lag.ack,
        "update_config": update_config,
        "set_precision": set_precision,
        "gate_stepping": host.gate.set_stepping,
        "gate_release": host.gate.release,
        "gate_interrupt": host.gate.interrupt,
        "record_path": partial(setattr, host, "record_path"),
        "set_record_path": host.set_record_path,
        "replay_speed": partial(setattr, host, "replay_speed"),
    }


def _obey(cmd_in: Any, host: EngineHost, handlers: dict[str, Callable[..., object]]) -> None:
    """Carry out the parent's commands in order until it says shutdown or its end of the pipe closes."""
    while True:
        try:
            op, *args = cmd_in.recv()
        except (EOFError, OSError):
            op, args = "shutdown", []
        if op == "shutdown":
            handlers["ack"]()  # an engine waiting for the UI does not hold up the shutdown
            host.shutdown()
            return
        handlers[op](*args)
