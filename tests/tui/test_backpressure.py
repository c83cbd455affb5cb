"""The engine process waits for a UI that fell far behind (backpressure.py), and for no other."""

from __future__ import annotations

import threading
import time
from unittest.mock import MagicMock

from engine.events import Step
from specchat.tui.backpressure import UiLag
from specchat.tui.engine_process import _command_handlers
from specchat.tui.headless import make_session
from specchat.tui.host import EngineHost, wait_items
from specchat.tui.host_api import ChatJob, Delivery, JobDone


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_ui_that_keeps_up_is_never_waited_for():
    clock = Clock()
    lag = UiLag(lag_s=0.4, max_wait_s=60.0, clock=clock)
    lag.wait()  # nothing sent
    lag.sent()
    clock.now += 0.3
    lag.wait()  # sent, but not long ago
    lag.ack()
    clock.now += 5.0
    lag.wait()  # acknowledged
    assert lag.pauses == 0 and not lag.behind()


def test_the_engine_waits_for_a_lagging_ui_until_it_acknowledges():
    clock = Clock()
    lag = UiLag(lag_s=0.4, max_wait_s=60.0, clock=clock)
    lag.sent()
    clock.now += 0.5
    assert lag.behind()
    threading.Timer(0.1, lag.ack).start()
    t0 = time.monotonic()
    lag.wait()
    assert lag.pauses == 1
    assert time.monotonic() - t0 < 30, "the wait did not end at the acknowledgement"
    assert not lag.behind()


def test_a_ui_that_never_drains_costs_a_bounded_wait():
    clock = Clock()
    lag = UiLag(lag_s=0.4, max_wait_s=0.05, clock=clock)
    lag.sent()
    clock.now += 1.0
    t0 = time.monotonic()
    lag.wait()
    assert time.monotonic() - t0 < 5
    assert lag.pauses == 1


def test_only_the_first_batch_since_an_acknowledgement_dates_the_lag():
    clock = Clock()
    lag = UiLag(lag_s=0.4, clock=clock)
    lag.sent()
    clock.now += 0.3
    lag.sent()  # later batches do not reset the clock of the oldest one waiting
    clock.now += 0.2
    assert lag.behind()


def test_the_host_paces_after_every_step():
    session = make_session()
    host = EngineHost(lambda progress: session, wake=lambda: None)
    paced: list[int] = []
    host.pace = lambda: paced.append(1)
    thread = threading.Thread(target=host.run, daemon=True)
    thread.start()
    try:
        job = host.submit(ChatJob("hello"))
        items = wait_items(host, lambda got: any(isinstance(i, JobDone) and i.job == job for i in got))
        steps = sum(isinstance(i, Delivery) and isinstance(i.record, Step) for i in items)
        assert steps > 0 and len(paced) == steps
    finally:
        host.shutdown()
        thread.join(5)


def test_a_cancel_ends_the_wait_at_once():
    """Esc while the engine waits for the UI: the answer stops now, not after the wait."""
    clock = Clock()
    lag = UiLag(lag_s=0.4, max_wait_s=60.0, clock=clock)
    host = MagicMock()  # an EngineHost as the handlers see it
    handlers = _command_handlers(host, rpc_out=None, lag=lag)
    lag.sent()
    clock.now += 1.0
    waiter = threading.Thread(target=lag.wait)
    waiter.start()
    time.sleep(0.05)
    handlers["cancel"]()
    waiter.join(10)
    assert not waiter.is_alive()
    host.cancel.assert_called_once()
