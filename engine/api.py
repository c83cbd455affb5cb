"""The small session API the app uses. The app talks to the engine only through this and events.

Threading contract: ``chat``/``generate`` run on one long-lived engine thread (it owns the model);
``cancel`` and ``update_config`` may be called from any thread and take effect at the next step
boundary. Events are plain frozen dataclasses (engine.events), safe to hand to another thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from engine.config import SpecConfig
from engine.events import Event

Message = dict[str, str]  # {"role": "user"|"assistant"|"system", "content": str}


class SessionAPI(Protocol):
    model_name: str

    @property
    def config(self) -> SpecConfig:
        """The settings in force (the last applied)."""

    @property
    def pending_config(self) -> SpecConfig | None:
        """Settings accepted by update_config() but not yet applied (None when none wait)."""

    @property
    def messages(self) -> list[Message]:
        """The conversation so far (a copy)."""

    def chat(self, user_text: str) -> Iterator[Event]:
        """Append a user turn, stream the answer (Started, Step..., Finished), append it.

        A cancelled answer is kept as far as it got, so the conversation stays usable.
        """

    def generate(self, messages: list[Message], config: SpecConfig | None = None) -> Iterator[Event]:
        """Answer ``messages`` without touching the conversation (compare mode, benchmarks)."""

    def cancel(self) -> None:
        """Stop the running answer at the next step boundary (Finished(reason="cancelled"))."""

    def update_config(self, config: SpecConfig) -> None:
        """Validate and queue ``config``; raises ConfigError (old settings stay) if unusable."""

    def set_precision(self, precision: str) -> bool:
        """Switch the target's arithmetic (exact | fast) now (True) or when the answer streaming
        ends (False); the next answer reads the conversation again in it. ConfigError if it cannot."""

    def reset(self) -> None:
        """Start a new conversation (the KV cache is dropped)."""
