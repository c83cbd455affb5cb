"""The engine thread: one long-lived thread owns the session (and the model, and the CUDA context).

The UI never calls the session's generators itself. It submits jobs (chat, compare, replay, reset)
to :class:`EngineHost`; the host runs them one at a time on its thread and hands every item it
produces to a :class:`Mailbox`. The mailbox never waits for the UI: ``put`` appends to a deque
and, only when the UI has not been told yet, calls ``wake`` (a non-blocking ``post_message``).
The UI drains everything that has arrived in one go, so a slow frame costs the engine nothing and
a fast engine costs the UI one message per frame, not one per token.

``cancel()`` and ``update_config()`` go straight to the session (they are thread-safe). The step
gate makes the engine pause at step boundaries for teaching mode and replay step-through; that
wait is the user's choice, never the UI's speed.

Nothing here imports Textual, so the host is tested on its own.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import itertools
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import assert_never

from engine.config import SpecConfig
from engine.events import Event, Finished, Started, Step
from specchat.tui.host_api import (
    HOST_JOB,
    ChatJob,
    CompareJob,
    Delivery,
    GateWaiting,
    HostedSession,
    Item,
    Job,
    JobDone,
    Lane,
    Loaded,
    LoadFailed,
    LoadProgress,
    ReplayJob,
    RereadJob,
    ResetJob,
    RestoreJob,
    SaveFailed,
    SessionFactory,
    WarmJob,
)
from specchat.tui.pending import PendingChange
from specchat.tui.trace import Record, TraceWriter, UserTurn


def lower_priority(native_thread_id: int | None, nice: int) -> bool:
    """Give the UI's event-loop thread a lower CPU priority than the engine's threads (Linux).

    Why: every matrix product of a forward ends in a barrier of all the engine's OpenMP threads, so
    on a machine with few cores the event loop's rendering, taking a core for a few milliseconds,
    stalls the whole team; measured on the 2-core VM, a thread busy 20% of the time cut decoding by
    20-25%, and by nothing measurable at nice 19. With a lower priority the event loop runs in the
    gaps the engine leaves (and at full speed when the engine is idle: priority only matters under
    contention). Called from the engine thread once it exists, since threads inherit the priority
    of the thread that creates them. Linux applies nice per thread; elsewhere this does nothing.
    """
    if native_thread_id is None or nice <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        current = os.getpriority(os.PRIO_PROCESS, native_thread_id)
        os.setpriority(os.PRIO_PROCESS, native_thread_id, min(19, current + nice))
    except OSError:
        return False
    return True


def freeze_loaded_objects() -> None:
    """Exempt everything alive after loading (model, tokenizer, vocabularies) from garbage collection.

    Why: the event loop allocates many short-lived objects per frame, and each full collection
    it triggers walks every tracked object in the process, the tokenizer's and the engine's too.
    Measured while streaming on the 2-core VM: about 10% of the event loop's samples were in
    the collector. Frozen objects are skipped; anything created later is collected as usual.

    They are thawed at exit: objects still frozen when the interpreter finalizes are never freed,
    and extension modules that check for leaks at shutdown (Triton's nanobind bindings, imported by
    transformers and on CUDA) then print a screen of "nanobind: leaked ..." lines.
    """
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # once, however many loads
    atexit.register(gc.unfreeze)


class Mailbox:
    """Engine -> UI hand-over that never blocks the producer on the consumer.

    Deliveries (tokens, steps) wait for the UI's next frame; anything else (a job ended, the
    engine paused, the model loaded) wakes the UI again at once, so Esc or the end of an answer is
    shown without waiting for the frame pacing.
    """

    def __init__(self, wake: Callable[[], object]) -> None:
        self._wake = wake
        self._items: deque[Item] = deque()
        self._lock = threading.Lock()
        self._signalled = False
        self._urgent = False
        self.wakes = 0

    @property
    def urgent(self) -> bool:
        """Something other than a delivery is waiting."""
        return self._urgent

    def put(self, item: Item) -> None:
        urgent = not isinstance(item, Delivery)
        with self._lock:
            self._items.append(item)
            if self._signalled and (not urgent or self._urgent):
                return
            self._signalled = True
            self._urgent = self._urgent or urgent
        self.wakes += 1
        self._wake()

    def drain(self) -> list[Item]:
        with self._lock:
            self._signalled = False
            self._urgent = False
            items = list(self._items)
            self._items.clear()
        return items


def _no_pause() -> None:
    pass


class StepGate:
    """Pauses the engine thread between steps while 'stepping' is on; 'release' lets one step through."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._stepping = False
        self._permits = 0
        self._interrupted = False

    @property
    def stepping(self) -> bool:
        return self._stepping

    def set_stepping(self, on: bool) -> None:
        with self._cond:
            self._stepping = on
            self._permits = 0
            self._cond.notify_all()

    def release(self, steps: int = 1) -> None:
        with self._cond:
            self._permits += steps
            self._cond.notify_all()

    def interrupt(self) -> None:
        """Wake a waiting engine (cancel, shutdown); cleared by the next job."""
        with self._cond:
            self._interrupted = True
            self._cond.notify_all()

    def reset(self) -> None:
        with self._cond:
            self._interrupted = False
            self._permits = 0

    def wait(self, on_wait: Callable[[], None] | None = None) -> None:
        with self._cond:
            if not self._stepping or self._interrupted:
                return
            if self._permits > 0:
                self._permits -= 1
                return
            if on_wait is not None:
                on_wait()
            self._cond.wait_for(lambda: not self._stepping or self._interrupted or self._permits > 0)
            if self._permits > 0:
                self._permits -= 1


class EngineHost:
    """Runs jobs on the engine thread; see the module docstring."""

    def __init__(
        self,
        factory: SessionFactory | None,
        wake: Callable[[], object],
        *,
        record_path: str | None = None,
        replay_speed: float = 1.0,
        ui_thread: int | None = None,
        ui_nice: int = 0,
    ) -> None:
        self._factory = factory
        self._ui_thread, self._ui_nice = ui_thread, ui_nice
        self.mailbox = Mailbox(wake)
        self.gate = StepGate()
        self.session: HostedSession | None = None
        self.record_path = record_path
        self._writer: TraceWriter | None = None
        self._save_failed = False  # the current file could not be written: the chat goes on unsaved
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._cancelled = threading.Event()
        self.replay_speed = replay_speed
        self.thread_id: int | None = None
        self.ui_niced = False
        # a precision asked for while a job runs waits for the job's end; value: the last switched to
        self._precision: PendingChange[str] = PendingChange("", self._switch_precision)
        self.compares = 0  # compare jobs run; odd ones run the baseline first, even ones speculative first
        self.pace: Callable[[], None] = _no_pause  # between steps: the engine process waits for a lagging UI
        self._last_started: Started | None = None

    def set_record_path(self, path: str | None, records: Sequence[Record] = ()) -> None:
        """Record from now on into ``path`` (a new conversation, or a reopened one: ``records`` first).

        Called from the UI thread between jobs (the app refuses while an answer runs)."""
        self._close_writer()
        self.record_path = path
        self._save_failed = False
        if path is not None and records:
            self._save(lambda: self._write_all(path, records))

    def _write_all(self, path: str, records: Sequence[Record]) -> None:
        writer = self._open_writer(path)
        for record in records:
            writer.write(record)

    # called from the UI thread -------------------------------------------------------------
    def submit(self, job: Job) -> int:
        return self.enqueue(dataclasses.replace(job, id=next(self._ids)))

    def enqueue(self, job: Job) -> int:
        """Queue a numbered job (a process host numbers its jobs in the UI process and sends them here)."""
        self._jobs.put(job)
        return job.id

    def cancel(self) -> None:
        self._cancelled.set()
        if self.session is not None:
            self.session.cancel()
        self.gate.interrupt()

    def update_config(self, config: SpecConfig) -> bool:
        """Raises ConfigError if the session refuses; thread-safe by the SessionAPI contract.

        Returns True when the session applied it at once (it was idle, so no event will say so)."""
        if self.session is None:
            raise RuntimeError("no session loaded")
        self.session.update_config(config)
        return applied_at_once(self.session.config, self.session.pending_config, config)

    def set_precision(self, precision: str) -> bool:
        """Raises ConfigError if the session refuses; True when it switched at once. While a job
        runs the switch waits for the job's end, not its answer's: a compare's two runs share one
        precision."""
        self._loaded.check_precision(precision)
        return self._precision.ask(precision)

    def _switch_precision(self, precision: str) -> None:
        """Between jobs: the session switches, then reads the conversation again in the new arithmetic."""
        session = self._loaded
        changed = session.precision != precision
        session.set_precision(precision)
        if changed:  # the same precision again keeps its cache: nothing to read
            self.enqueue(RereadJob(id=HOST_JOB))

    def shutdown(self) -> None:
        self._stop.set()
        self.cancel()
        self._jobs.put(None)

    def drain(self) -> list[Item]:
        return self.mailbox.drain()

    # the engine thread -----------------------------------------------------------------------
    def run(self) -> None:
        self.thread_id = threading.get_ident()
        self.ui_niced = lower_priority(self._ui_thread, self._ui_nice)
        try:
            try:
                if self._factory is not None:
                    self.session = self._factory(self._progress)
            except Exception as exc:  # the loader's message is the user's only clue
                self.mailbox.put(LoadFailed(_one_line(exc)))
                return
            freeze_loaded_objects()
            if self.session is not None:
                self.enqueue(WarmJob(id=HOST_JOB))  # before the UI can send anything: the first job run
                self.mailbox.put(Loaded(self.session.model_name, self.session.config, tuple(self.session.methods)))
            else:
                self.mailbox.put(Loaded("", None))
            self._loop()
        finally:
            self._close_writer()

    def _progress(self, stage: str, done: int, total: int) -> None:
        self.mailbox.put(LoadProgress(stage, done, total))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._jobs.get(timeout=0.25)
            except queue.Empty:
                continue
            if job is None:
                break
            self._cancelled.clear()
            self.gate.reset()
            self._precision.begin()
            error = ""
            try:
                self._run_job(job)
            except Exception as exc:
                error = _one_line(exc)
            try:
                self._precision.end()  # a switch asked for meanwhile (checked when asked for)
            except Exception as exc:  # it failed after all: the old precision stays, the engine goes on
                error = error or f"the precision was not switched: {_one_line(exc)}"
            self.mailbox.put(JobDone(job.id, job.kind, error))

    def _save(self, write: Callable[[], object]) -> None:
        """Run one write to the conversation's file; an OSError (a full disk) stops the saving, not the chat:
        the UI is told once, the records stay in memory (the transcript, the session's messages)."""
        try:
            write()
        except OSError as exc:
            self._save_failed = True
            self._close_writer()
            self.mailbox.put(SaveFailed(str(self.record_path), exc.strerror or str(exc)))

    def _close_writer(self) -> None:
        """Close the trace file; what a full disk kept in its buffer is dropped (a failed save was said)."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            writer.close()
        except OSError:
            writer.abandon()

    def _open_writer(self, path: str) -> TraceWriter:
        cfg = self.session.config if self.session is not None else None
        name = self.session.model_name if self.session is not None else ""
        self._writer = TraceWriter(path, model=name, drafter=cfg.method if cfg else "",
                                   config=cfg.to_dict() if cfg else None)
        self._writer.open()
        return self._writer

    def _deliver(self, job: ChatJob | CompareJob, lane: Lane, record: Record) -> None:
        """A live record to the UI, and to the recording if one is on (a replay or a restore shows
        recorded records, which it puts in the mailbox itself); a failed save is said once (_save)."""
        if self.record_path is not None and not self._save_failed:
            path = self.record_path
            self._save(lambda: (self._writer or self._open_writer(path)).write(record))
        if isinstance(record, Started):
            self._last_started = record
        self.mailbox.put(Delivery(job.id, lane, record))

    def _pump(self, job: ChatJob | CompareJob, lane: Lane, events: Iterator[Event]) -> Finished | None:
        """Forward a session generator's events; pause at the gate after each step."""
        last: Finished | None = None
        try:
            for ev in events:
                self._deliver(job, lane, ev)
                if isinstance(ev, Finished):
                    last = ev
                elif isinstance(ev, Step):
                    self.gate.wait(lambda: self.mailbox.put(GateWaiting(job.id)))
                    self.pace()
                if self._stop.is_set():
                    break
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()
        return last

    @property
    def _loaded(self) -> HostedSession:
        """The session, for a job that needs one (a replay runs without)."""
        if self.session is None:
            raise RuntimeError("no session loaded")
        return self.session

    def _run_job(self, job: Job) -> None:
        """The job's work, chosen by its type: a new kind of job without a case here is a type error."""
        match job:
            case ChatJob():
                self._chat(job)
            case CompareJob():
                self._compare(job)
            case ReplayJob():
                self._replay(job)
            case RestoreJob():
                self._restore(job)
            case ResetJob():
                self._loaded.reset()
            case RereadJob():  # after a precision switch, before the next answer is timed
                self._loaded.reread()
            case WarmJob():
                self._loaded.warm_up()
            case _:
                assert_never(job)

    def _chat(self, job: ChatJob) -> None:
        self._deliver(job, "chat", UserTurn(text=job.text, mode="chat"))
        self._pump(job, "chat", self._loaded.chat(job.text))

    def _compare(self, job: CompareJob) -> None:
        """Method A and method B (by default the baseline and the method in force) one after the
        other, each timed alone on this thread, fairly; when A is speculative too, the baseline runs
        as well, so each has its speed-up against plain decoding:

        * all start from the same cache state: after the first run the cache is cut back to the
          prefix it reused (``Started.reused_tokens``), so the others pay the same prefill
          (all cold on a first turn, all warm after), instead of reusing the first run's prompt;
        * the order rotates from one compare to the next (the first compare: the baseline first).
        """
        self._deliver(job, "spec", UserTurn(text=job.text, mode="compare", methods=job.methods))
        session = self._loaded
        messages = [*session.messages, {"role": "user", "content": job.text}]
        runs = compare_runs(session.config, job.methods, job.given)
        self.compares += 1
        shift = (self.compares - 1) % len(runs)
        runs = runs[shift:] + runs[:shift]
        mark: int | None = None
        for lane, config in runs:
            if self._cancelled.is_set() or self._stop.is_set():
                return
            if mark is not None:
                session.rewind_cache(mark)
            self._last_started = None
            self._pump(job, lane, session.generate(messages, config))
            if self._last_started is None:  # refused or cancelled before it started
                return
            mark = self._last_started.reused_tokens

    def _restore(self, job: RestoreJob) -> None:
        """Reopen a saved conversation: the session goes on from its messages, the UI shows its turns."""
        from specchat.tui.sessions import answer_ids, chat_records, conversation

        self._loaded.restore(conversation(job.records), answer_ids(job.records))
        for record in chat_records(job.records):
            self.mailbox.put(Delivery(job.id, "chat", record))

    def _replay(self, job: ReplayJob) -> None:
        """Play recorded records with their original pacing (scaled by ``replay_speed``)."""
        lane: Lane = "chat"
        turn: UserTurn | None = None
        for record in job.records:
            if self._cancelled.is_set() or self._stop.is_set():
                return
            if isinstance(record, UserTurn):
                turn = record if record.mode == "compare" else None
                lane = "spec" if turn is not None else "chat"
                self.mailbox.put(Delivery(job.id, lane, record))
                continue
            if isinstance(record, Started):
                if turn is not None:
                    lane = replay_lane(turn.methods, record.drafter)
                self._sleep(record.prefill_ms)
            elif isinstance(record, Step):
                self._sleep(record.timing.total_ms)
            self.mailbox.put(Delivery(job.id, lane, record))
            if isinstance(record, Step):
                self.gate.wait(lambda: self.mailbox.put(GateWaiting(job.id)))

    def _sleep(self, ms: float) -> None:
        speed = self.replay_speed
        if speed <= 0 or ms <= 0 or self.gate.stepping:
            return
        self._cancelled.wait(ms / 1000 / speed)


def compare_runs(config: SpecConfig, methods: tuple[str, ...],
                 given: Collection[str] = ()) -> list[tuple[Lane, SpecConfig | None]]:
    """The runs of one compare, in the first compare's order: the baseline, then A (when it is
    speculative), then B. ``None``: the settings in force (hot-swaps apply, as in a chat). A method
    not in force runs as a switch to it would (SpecConfig.with_method: ``given`` kept, its own defaults
    for the rest)."""
    a, b = methods if len(methods) == 2 else ("none", config.method)
    runs: list[tuple[Lane, SpecConfig | None]] = [("baseline", config.replace(method="none"))]
    if a != "none":
        runs.append(("alt", config.with_method(a, given)))
    runs.append(("spec", None if b == config.method else config.with_method(b, given)))
    return runs


def replay_lane(methods: tuple[str, ...], drafter: str) -> Lane:
    """The pane a recorded compare answer belongs to, from the method that answered it."""
    if drafter == "none":
        return "baseline"
    return "alt" if len(methods) == 2 and drafter == methods[0] else "spec"


def applied_at_once(in_force: SpecConfig | None, pending: SpecConfig | None, asked: SpecConfig) -> bool:
    """Whether a session that accepted ``asked`` has it in force already (no event will announce it)."""
    return pending is None and in_force == asked


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    msg = text[0] if text else ""
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def wait_items(host: EngineHost, until: Callable[[list[Item]], bool], timeout: float = 10.0) -> list[Item]:
    """Drain a host without a UI until ``until(all_items)`` holds (tests, headless timing)."""
    got: list[Item] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got.extend(host.drain())
        if until(got):
            return got
        time.sleep(0.002)
    raise TimeoutError("engine host did not finish in time")
