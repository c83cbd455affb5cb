"""The app's status as the screens show it around the conversation: title bar, status line, stats
clock, teaching panel (what a UI designer calls the chrome).

Why one value: the app builds an :class:`AppStatus` after each batch of engine items (or a key that
changes its state) and hands it to each screen, which shows it with its own widgets. Screens never
ask the app for its state; a screen coming back into view posts ``StatusStale`` and gets a fresh one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.config import SpecConfig


@dataclass(frozen=True)
class AppStatus:
    model: str
    applied: SpecConfig
    pending: SpecConfig | None
    ui_values: dict[str, Any] = field(default_factory=dict)
    status: str = ""  # what the engine is doing, when the user may want to act on it
    replay: str = ""  # "REPLAY ×1 ▶" while a recording plays
    context: str = ""  # "ctx 1,234/8,192"
    precision: str = ""  # shown only when not the exact reference
    stepping: bool = False  # the step gate pauses the engine (teaching / step-through)
    prefill: tuple[int, int] | None = None
    teaching: bool = False
    waiting: bool = False  # the engine waits at the gate for F8
    replaying: bool = False


def status_line(*, busy: bool, prefill: tuple[int, int] | None, waiting: bool) -> str:
    """The most pressing thing the engine is doing, with the key that acts on it."""
    if waiting:
        return "‖ paused · F8 next step"
    if prefill is not None:
        return f"reading the prompt {prefill[0]:,}/{prefill[1]:,} · Esc stops"
    return "answering… Esc stops" if busy else ""


def replay_line(*, speed: float, paused: bool, stepping: bool) -> str:
    state = "paused" if paused else ("step-through" if stepping else "▶")
    return f"REPLAY ×{speed:g} {state}"


def precision_line(precision: str) -> str:
    return "" if precision == "exact" else f"{precision} precision"
