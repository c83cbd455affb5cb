"""The engine thread host, without any UI: ordering, one thread, compare timing, cancel, gate."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.events import ConfigApplied, Finished, Started, Step
from specchat.tui.headless import make_session
from specchat.tui.host import EngineHost, Mailbox, wait_items
from specchat.tui.host_api import ChatJob, CompareJob, Delivery, GateWaiting, JobDone, Loaded, ReplayJob
from specchat.tui.trace import UserTurn, read_trace


def _host(session, **kw) -> tuple[EngineHost, threading.Thread]:
    host = EngineHost(lambda progress: session, wake=lambda: None, **kw)
    thread = threading.Thread(target=host.run, daemon=True)
    thread.start()
    return host, thread


def _done(job: int):
    return lambda items: any(isinstance(i, JobDone) and i.job == job for i in items)


def test_chat_job_delivers_turn_then_events_in_order():
    session = make_session()
    host, thread = _host(session)
    try:
        job = host.submit(ChatJob("hello"))
        items = wait_items(host, _done(job))
        assert isinstance(items[0], Loaded)
        records = [i.record for i in items if isinstance(i, Delivery)]
        assert records[0] == UserTurn(text="hello", mode="chat")
        assert isinstance(records[1], Started) and isinstance(records[-1], Finished)
        assert all(isinstance(r, Step) for r in records[2:-1])
        assert session.threads == {host.thread_id}, "the session runs on the engine thread only"
    finally:
        host.shutdown()
        thread.join(5)
    assert not thread.is_alive()


def test_compare_runs_baseline_then_speculative_one_at_a_time():
    session = make_session(step_delay=0.001)
    host, thread = _host(session)
    try:
        job = host.submit(CompareJob("same prompt"))
        items = wait_items(host, _done(job))
        lanes = [i.lane for i in items if isinstance(i, Delivery) and not isinstance(i.record, UserTurn)]
        # all baseline events strictly before any speculative one: never interleaved
        assert lanes == sorted(lanes, key=lambda lane: lane != "baseline")
        assert set(lanes) == {"baseline", "spec"}
        assert session.calls == [("generate", "none"), ("generate", "session")]
        base = [i.record for i in items if isinstance(i, Delivery) and i.lane == "baseline"]
        assert all(len(s.committed) == 1 and s.tree.num_drafts == 0 for s in base if isinstance(s, Step))
        assert session.messages == [], "compare does not touch the conversation"
    finally:
        host.shutdown()
        thread.join(5)


def test_cancel_stops_at_a_step_boundary_and_skips_the_second_compare_run():
    session = make_session(step_delay=0.02)
    host, thread = _host(session)
    try:
        job = host.submit(CompareJob("long"))
        wait_items(host, lambda items: sum(isinstance(i, Delivery) and isinstance(i.record, Step)
                                           for i in items) >= 2)
        host.cancel()
        items = wait_items(host, _done(job))
        fins = [i.record for i in items if isinstance(i, Delivery) and isinstance(i.record, Finished)]
        assert [f.reason for f in fins] == ["cancelled"]
        assert session.calls == [("generate", "none")]
        # the host is usable afterwards
        job2 = host.submit(ChatJob("again"))
        items = wait_items(host, _done(job2))
        fins = [i.record for i in items if isinstance(i, Delivery) and isinstance(i.record, Finished)]
        assert [f.reason for f in fins] == ["stop"]
    finally:
        host.shutdown()
        thread.join(5)


def test_step_gate_pauses_between_steps_until_released():
    session = make_session()
    host, thread = _host(session)
    host.gate.set_stepping(True)
    try:
        host.submit(ChatJob("x"))
        items = wait_items(host, lambda items: any(isinstance(i, GateWaiting) for i in items))
        steps = [i for i in items if isinstance(i, Delivery) and isinstance(i.record, Step)]
        assert len(steps) == 1
        time.sleep(0.05)
        assert not any(isinstance(i, Delivery) for i in host.drain()), "nothing moves while paused"
        host.gate.release()
        items = wait_items(host, lambda items: any(isinstance(i, GateWaiting) for i in items))
        assert sum(isinstance(i, Delivery) and isinstance(i.record, Step) for i in items) == 1
        host.gate.set_stepping(False)  # leaving teaching mode lets the answer run out
        wait_items(host, lambda items: any(isinstance(i, JobDone) for i in items))
    finally:
        host.shutdown()
        thread.join(5)


def test_hot_swap_applies_at_the_next_step_boundary():
    session = make_session()
    host, thread = _host(session)
    host.gate.set_stepping(True)
    try:
        job = host.submit(ChatJob("x"))
        wait_items(host, lambda items: any(isinstance(i, GateWaiting) for i in items))
        new = session.config.replace(num_steps=3)
        host.update_config(new)
        assert session.pending_config == new and session.config != new
        host.gate.set_stepping(False)
        items = wait_items(host, _done(job))
        records = [i.record for i in items if isinstance(i, Delivery)]
        applied = [r for r in records if isinstance(r, ConfigApplied)]
        assert len(applied) == 1 and applied[0].config["num_steps"] == 3
        after = records[records.index(applied[0]) + 1]
        assert isinstance(after, Step) and after.config_version == applied[0].version
        assert session.config == new
    finally:
        host.shutdown()
        thread.join(5)


def test_record_then_replay_gives_the_same_records(tmp_path):
    path = tmp_path / "rec.jsonl"
    session = make_session()
    host, thread = _host(session, record_path=str(path))
    try:
        job = host.submit(ChatJob("one"))
        live = wait_items(host, _done(job))
        job = host.submit(CompareJob("two"))
        live += wait_items(host, _done(job))
    finally:
        host.shutdown()
        thread.join(5)
    header, records = read_trace(path)
    assert header["model"] == "fake-model" and header["config"]["method"] == "eagle3"
    assert records == [i.record for i in live if isinstance(i, Delivery)]

    replay = EngineHost(None, wake=lambda: None, replay_speed=0)
    t = threading.Thread(target=replay.run, daemon=True)
    t.start()
    try:
        job = replay.submit(ReplayJob(records))
        played = wait_items(replay, _done(job))
    finally:
        replay.shutdown()
        t.join(5)
    live_d = [(i.lane, i.record) for i in live if isinstance(i, Delivery)]
    played_d = [(i.lane, i.record) for i in played if isinstance(i, Delivery)]
    assert played_d == live_d, "replay restores the records and their panes (lanes)"


def test_mailbox_never_waits_for_the_consumer():
    wakes: list[int] = []
    box = Mailbox(lambda: wakes.append(1))

    def produce() -> None:
        for n in range(10_000):
            box.put(JobDone(n, "chat"))  # nobody drains: put must still return

    producer = threading.Thread(target=produce)
    producer.start()
    producer.join(10)
    assert not producer.is_alive(), "the producer never waits for a consumer"
    assert len(wakes) == 1, "one wake per undrained batch, not one per item"
    assert len(box.drain()) == 10_000
    box.put(JobDone(0, "chat"))
    assert len(wakes) == 2


def test_scripted_session_from_a_trace_replays_its_answers():
    from pathlib import Path

    from specchat.tui.scripted import ScriptedSession

    trace = Path(__file__).parent / "fixtures" / "demo.jsonl"
    session = ScriptedSession.from_trace(str(trace))
    assert session.model_name == "fake-model" and session.config.method == "eagle3"
    _, records = read_trace(trace)
    first_text = next(r for r in records if isinstance(r, Finished)).text
    events = list(session.chat("q"))
    assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
    assert "".join(e.text for e in events if isinstance(e, Step)) == first_text
    assert session.messages[-1] == {"role": "assistant", "content": first_text}


def test_freezing_the_loaded_objects_leaves_no_leak_report_at_exit() -> None:
    """Objects still frozen at exit are never freed: Triton's bindings then print "nanobind: leaked"."""
    pytest.importorskip("triton")
    code = ("import triton, triton.language\n"
            "class Holder: pass\n"
            "h = Holder(); h.me = h; h.triton = triton  # a cycle, as the loaded model's objects form\n"
            "from specchat.tui.host import freeze_loaded_objects\n"
            "freeze_loaded_objects(); freeze_loaded_objects()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "leaked" not in out.stderr, out.stderr[:300]
