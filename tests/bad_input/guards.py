"""Trip-wires for the bad-input suite: the target's weights read, the TUI or the server started.

Why trip-wires: a refusal is only worth having before work is spent. A case that says the model
must not load installs :func:`install` with ``weights=True``; reading the target's weights then
raises :class:`Tripped` (and records it, in case some caller swallows the exception). Starting the
TUI or the web server trips always: no bad input may get that far, and in a test either would block;
so does looking up the embedded model (a first conversion takes minutes: a case names the tiny one).

The wire for the weights sits where the target's tensors are read (inside ``engine.loader.load_model``,
after the model is found and its config and tokenizer read), so a missing model folder or a bad
``--dtype``, refused on the way there, still counts as "before the load". ``train-draft`` reads its
target through ``engine.train.pipeline.load_target``: the wire lets it find the model, then trips.

Also used in a subprocess (``python -c`` with :func:`install_for_subprocess`), so one module says
what "loaded" means for both ways of running a case.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LOADED = "the target model was loaded"
TUI = "the TUI started"
SERVER = "the web server started"
EMBEDDED = "the embedded model was looked up (name the tiny model: {model})"


class Tripped(AssertionError):
    """Work started that a refused input must never reach."""


@dataclass
class Seen:
    """What tripped during one case (kept even where the exception was caught)."""

    events: list[str] = field(default_factory=list)
    _in_target: int = 0

    def trip(self, what: str) -> None:
        self.events.append(what)
        raise Tripped(f"bad-input guard: {what}")


Setter = Callable[[Any, str, Any], None]


def install(setattr_: Setter, seen: Seen, *, weights: bool) -> None:
    """Install the trip-wires with ``setattr_`` (monkeypatch.setattr, or plain setattr in a subprocess)."""
    import engine.loader
    import engine.models.checkpoint
    import engine.models.gguf_weights
    import engine.models.hf
    import engine.models.resolve
    import engine.train.pipeline
    import specchat.serve
    import specchat.tui.app

    setattr_(specchat.tui.app.SpecChatApp, "run", lambda *a, **k: seen.trip(TUI))
    setattr_(specchat.serve.SpecchatServer, "serve", lambda *a, **k: seen.trip(SERVER))
    setattr_(engine.models.resolve, "embedded_gguf", lambda *a, **k: seen.trip(EMBEDDED))  # slow, and not ours
    if not weights:
        return
    setattr_(engine.loader, "load_model", _marking(engine.loader.load_model, seen))
    for owner, name in ((engine.models.checkpoint, "load_state_dict"), (engine.models.gguf_weights, "load_gguf_state"),
                        (engine.models.hf.HFModel, "from_pretrained")):
        setattr_(owner, name, _tripping(getattr(owner, name), seen))
    setattr_(engine.train.pipeline, "load_target", _finding_then_tripping(seen))


def _marking(load_model: Callable[..., Any], seen: Seen) -> Callable[..., Any]:
    """load_model, with the reads of weights inside it marked as the target's."""
    @functools.wraps(load_model)
    def marked(*args: Any, **kwargs: Any) -> Any:
        seen._in_target += 1
        try:
            return load_model(*args, **kwargs)
        finally:
            seen._in_target -= 1
    return marked


def _tripping(read: Callable[..., Any], seen: Seen) -> Callable[..., Any]:
    """A weights reader that trips when the target's weights are read (a draft's pass through)."""
    @functools.wraps(read)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if seen._in_target:
            seen.trip(LOADED)
        return read(*args, **kwargs)
    return guarded


def _finding_then_tripping(seen: Seen) -> Callable[..., Any]:
    """train-draft's load_target: find the model (a missing one is still refused), then trip."""
    def load_target(name: str | None, *, device: str = "cpu", revision: str | None = None) -> Any:
        from engine.models.resolve import resolve_model

        resolve_model(name, revision=revision)
        seen.trip(LOADED)
    return load_target


def install_for_subprocess(weights: bool) -> None:
    """The same wires in a fresh interpreter (a case that must run in a subprocess)."""
    install(setattr, Seen(), weights=weights)
