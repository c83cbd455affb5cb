"""PendingChange: the one place the rule "asked for while a job runs, applied when it ends" lives
(the host's precision switch, the scripted session's hot-swaps, the UI's copy of both)."""

from __future__ import annotations

import pytest

from specchat.tui.pending import PendingChange


def test_idle_a_change_is_in_force_at_once_busy_it_waits_for_the_end() -> None:
    seen: list[str] = []
    change = PendingChange("exact", seen.append)
    assert change.ask("fast") is True and change.value == "fast" and seen == ["fast"]
    change.begin()
    assert change.ask("exact") is False
    assert (change.value, change.pending, change.wanted) == ("fast", "exact", "exact") and seen == ["fast"]
    assert change.end() == "exact" and (change.value, change.pending) == ("exact", None)
    assert seen == ["fast", "exact"]
    assert change.end() is None and seen == ["fast", "exact"]  # nothing held: nothing applied


def test_a_step_boundary_takes_the_held_change_before_the_job_ends() -> None:
    change = PendingChange(1)
    change.begin()
    change.ask(2)
    assert change.take() == 2 and change.value == 2 and change.take() is None
    assert change.ask(3) is False  # still busy until end()
    assert change.end() == 3


def test_a_refused_switch_changes_nothing() -> None:
    def refuse(value: str) -> None:
        raise ValueError(f"cannot run {value}")

    change = PendingChange("exact", refuse)
    with pytest.raises(ValueError):
        change.ask("fast")
    assert (change.value, change.pending) == ("exact", None)


def test_the_ui_copy_holds_what_the_host_holds_and_settles_on_the_engines_report() -> None:
    shown = PendingChange("exact")
    shown.hold("fast")
    assert shown.pending == "fast" and shown.wanted == "fast"
    shown.hold("exact")  # asking for the value in force again: nothing waits
    assert shown.pending is None
    shown.hold("fast")
    assert shown.settle("exact") is False and shown.pending == "fast"  # another report: still waiting
    assert shown.settle("fast") is True and (shown.value, shown.pending) == ("fast", None)


def test_a_held_change_that_fails_when_the_job_ends_is_dropped_and_the_old_value_stays() -> None:
    """The host applies a held switch when a job ends; if that fails the value in force stays and the
    change is not retried after every later job."""
    calls: list[str] = []

    def apply(value: str) -> None:
        calls.append(value)
        raise RuntimeError("out of memory")

    change = PendingChange("exact", apply)
    change.begin()
    change.ask("fast")  # held while the job runs
    with pytest.raises(RuntimeError):
        change.end()
    assert (change.value, change.pending) == ("exact", None)
    change.begin()
    assert change.end() is None and calls == ["fast"]
