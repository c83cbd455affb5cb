"""Messages that widgets, screens and the palette send up to the app.

Why messages: a screen or a palette provider that called the app's methods would have to import
the app (an import circle) or reach into it untyped. Posting a message says what happened; the app,
which owns the engine and the settings, decides what to do.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message


class EngineWake(Message):
    """Something is waiting in the engine host's mailbox."""


class StatusStale(Message):
    """The title bar, status and panels need the app's state again (a screen came back into view)."""


class OpenSettings(Message):
    """Open the settings panel, with ``field`` focused (None: where it was)."""

    def __init__(self, field: str | None = None) -> None:
        super().__init__()
        self.field = field


class ChangeSetting(Message):
    """Change one setting to a typed value (from the palette: 'num_steps 3')."""

    def __init__(self, name: str, value: Any) -> None:
        super().__init__()
        self.name = name
        self.value = value
