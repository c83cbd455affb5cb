"""The engine in its own process (ProcessHost): the same items, commands and failures as the thread host.

Each test spawns a real child process running a scripted session (no model), so these take a
second or two each.
"""

from __future__ import annotations

import threading
import time

import pytest

from engine.config import ConfigError, SpecConfig
from engine.events import Finished, Step
from specchat.tui.app import SpecChatApp
from specchat.tui.engine_process import ProcessHost, _Forwarder
from specchat.tui.headless import ui_settings, wait_until
from specchat.tui.host import Mailbox
from specchat.tui.host_api import ChatJob, Delivery, GateWaiting, JobDone, Loaded, LoadFailed, LoadProgress
from specchat.tui.scripted import ScriptedLoader
from specchat.tui.widgets.transcript import AnswerView
from tests.tui.helpers import send

CONFIG = SpecConfig(method="ngram", num_draft_tokens=8)


class Collector:
    """Runs a ProcessHost's receiving loop on a thread and gathers what reaches the UI."""

    def __init__(self, loader: ScriptedLoader) -> None:
        self.woken = threading.Event()
        self.host = ProcessHost(loader, self.woken.set)
        self.items: list = []
        self.thread = threading.Thread(target=self.host.run, daemon=True)
        self.thread.start()

    def until(self, cond, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.woken.wait(0.05)
            self.woken.clear()
            self.items += self.host.drain()
            found = [i for i in self.items if cond(i)]
            if found:
                return found[-1]
        raise AssertionError(f"timed out; got {[type(i).__name__ for i in self.items]}")

    def close(self) -> None:
        self.host.shutdown()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive()
        assert not self.host._process.is_alive()


@pytest.fixture
def collector():
    made: list[Collector] = []

    def make(**kw) -> Collector:
        kw.setdefault("step_delay", 0.0)
        kw.setdefault("load_s", 0.0)
        c = Collector(ScriptedLoader(CONFIG, **kw))
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def test_loads_answers_and_reports_the_session(collector):
    c = collector(refuse_methods=(("eagle3", "no EAGLE-3 head is loaded"),))
    loaded = c.until(lambda i: isinstance(i, Loaded))
    assert loaded.model_name == "fake-model" and loaded.config == CONFIG
    assert any(isinstance(i, LoadProgress) for i in c.items)
    assert "ngram" in c.host.session.methods and "eagle3" not in c.host.session.methods
    job = c.host.submit(ChatJob("hello"))
    done = c.until(lambda i: isinstance(i, JobDone) and i.job == job)
    assert done.error == ""
    records = [i.record for i in c.items if isinstance(i, Delivery) and i.job == job]
    assert any(isinstance(r, Step) for r in records)
    assert isinstance(records[-1], Finished) and records[-1].reason == "stop"


def test_a_refused_hot_swap_raises_here_and_keeps_the_settings(collector):
    c = collector(refuse_methods=(("eagle3", "no EAGLE-3 head is loaded"),))
    c.until(lambda i: isinstance(i, Loaded))
    with pytest.raises(ConfigError, match="no EAGLE-3 head"):
        c.host.update_config(CONFIG.replace(method="eagle3"))
    assert c.host.session.config == CONFIG
    new = CONFIG.replace(num_draft_tokens=4)
    c.host.update_config(new)
    assert c.host.session.config == new and c.host.session.pending_config is None


def test_cancel_stops_the_answer_and_the_next_one_runs(collector):
    c = collector(step_delay=0.05)
    c.until(lambda i: isinstance(i, Loaded))
    first = c.host.submit(ChatJob("a long one"))
    c.until(lambda i: isinstance(i, Delivery) and isinstance(i.record, Step))
    c.host.cancel()
    c.until(lambda i: isinstance(i, JobDone) and i.job == first)
    fin = [i.record for i in c.items if isinstance(i, Delivery) and i.job == first and isinstance(i.record, Finished)]
    assert fin and fin[-1].reason == "cancelled"
    second = c.host.submit(ChatJob("and now?"))
    c.until(lambda i: isinstance(i, JobDone) and i.job == second)
    fin = [i.record for i in c.items if isinstance(i, Delivery) and i.job == second and isinstance(i.record, Finished)]
    assert fin and fin[-1].reason == "stop"


def test_the_step_gate_crosses_the_process(collector):
    c = collector()
    c.until(lambda i: isinstance(i, Loaded))
    c.host.gate.set_stepping(True)
    assert c.host.gate.stepping
    job = c.host.submit(ChatJob("step by step"))
    c.until(lambda i: isinstance(i, GateWaiting))
    steps = sum(isinstance(i, Delivery) and isinstance(i.record, Step) for i in c.items)
    assert steps == 1
    c.host.gate.release(2)
    time.sleep(0.3)
    c.items += c.host.drain()
    assert sum(isinstance(i, Delivery) and isinstance(i.record, Step) for i in c.items) == 3
    c.host.gate.set_stepping(False)
    c.until(lambda i: isinstance(i, JobDone) and i.job == job)


def test_a_failed_load_is_one_line(collector):
    c = collector(fail="model.safetensors is not a safetensors file")
    failed = c.until(lambda i: isinstance(i, LoadFailed))
    assert "not a safetensors file" in failed.message and "\n" not in failed.message


def test_an_engine_that_dies_is_reported(collector):
    c = collector(crash=True)
    failed = c.until(lambda i: isinstance(i, LoadFailed))
    assert "engine process stopped unexpectedly" in failed.message
    with pytest.raises(ConfigError, match="engine process has stopped"):  # a hot-swap is refused in one line
        c.host.update_config(CONFIG)


async def test_the_app_streams_from_an_engine_process():
    app = SpecChatApp(factory=ScriptedLoader(CONFIG, step_delay=0.0, load_s=0.0), config=CONFIG,
                      ui=ui_settings(save_sessions=False), engine_process=True)
    assert isinstance(app.host, ProcessHost)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.loaded, timeout=30, what="load")
        await send(pilot, "What is speculative decoding?")
        await wait_until(pilot, lambda: app.busy_job is None and bool(app.chat_screen.query(AnswerView)),
                         timeout=30, what="the answer")
        answer = app.chat_screen.query(AnswerView).last()
        assert answer.finished is not None and answer.finished.reason == "stop"
        assert answer.stream.plain_text.strip()
    assert not app.host._process.is_alive()  # quitting the app ends the engine process


class _Pipe:
    """The forwarder's end of the pipe: what it sent, and when."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, list]] = []
        self.got = threading.Event()

    def send(self, message) -> None:
        self.sent.append((time.monotonic(), message[1]))
        self.got.set()


class _MailHost:
    """What the forwarder reads of an EngineHost: its mailbox."""

    def __init__(self, wake) -> None:
        self.mailbox = Mailbox(wake)

    def drain(self) -> list:
        return self.mailbox.drain()


def _forwarding(batch_s: float) -> tuple[_Forwarder, _MailHost, _Pipe, threading.Thread]:
    pipe = _Pipe()
    forwarder = _Forwarder(pipe, batch_s=batch_s)
    host = _MailHost(forwarder.wake.set)
    forwarder.host = host
    thread = threading.Thread(target=forwarder.loop, daemon=True)
    thread.start()
    return forwarder, host, pipe, thread


def _stop(forwarder: _Forwarder, thread: threading.Thread) -> None:
    forwarder.stop = True
    forwarder.wake.set()
    thread.join(timeout=5)
    assert not thread.is_alive()


def _delivery(n: int) -> Delivery:
    return Delivery(job=1, lane="chat", record=Finished(reason="stop", text=str(n), tokens=n))


def test_deliveries_go_to_the_ui_in_batches():
    """A run of steps is one pipe write, not one per step (each write wakes two threads that take a
    core from the engine's OpenMP team)."""
    forwarder, host, pipe, thread = _forwarding(batch_s=0.5)
    for n in range(5):
        host.mailbox.put(_delivery(n))
        time.sleep(0.01)  # steps come a few ms apart
    assert pipe.got.wait(5)
    assert [len(batch) for _, batch in pipe.sent] == [5]
    _stop(forwarder, thread)


def test_an_urgent_item_is_sent_without_waiting_for_the_batch():
    forwarder, host, pipe, thread = _forwarding(batch_s=60.0)
    t0 = time.monotonic()
    host.mailbox.put(_delivery(0))
    host.mailbox.put(JobDone(1, "chat"))  # the answer ended: the UI must know now
    assert pipe.got.wait(5), "the batch waited out batch_s despite an urgent item"
    assert pipe.sent[0][0] - t0 < 5
    assert [type(i).__name__ for i in pipe.sent[0][1]] == ["Delivery", "JobDone"]
    _stop(forwarder, thread)


def test_a_stop_sends_what_waits():
    forwarder, host, pipe, thread = _forwarding(batch_s=60.0)
    host.mailbox.put(_delivery(0))
    time.sleep(0.05)  # the forwarder is waiting for company
    _stop(forwarder, thread)
    assert [len(batch) for _, batch in pipe.sent] == [1]
