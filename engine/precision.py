"""The target's arithmetic, "exact" or "fast", and a switch asked for while an answer streams.

Why an owner of its own: a switch cannot happen mid-answer (the cache holds K/V computed, and in
fast stored, in the other arithmetic), so one asked for then waits; this is the one place that
remembers it. What a switch invalidates (the cache, the drafters' state, the measured costs) is
the session's to drop, since it owns them.
"""

from __future__ import annotations

from engine.config import ConfigError
from engine.target import TargetModel


class PrecisionSwitch:
    """The target's precision and the one waiting for the answer streaming to end."""

    def __init__(self, model: TargetModel) -> None:
        self._model = model
        self.pending: str | None = None

    @property
    def current(self) -> str:
        """"exact" or "fast" (LlamaModel.precision); "" for a backend with one arithmetic."""
        return self._model.precision

    def check(self, precision: str) -> None:
        """Raise ConfigError (one line) where the target cannot run ``precision``."""
        if not self.current:
            raise ConfigError("this backend computes in one precision; specchat's own forward has exact and fast")
        if precision not in ("exact", "fast"):
            raise ConfigError(f"precision is exact or fast, not {precision!r}")
        if precision == "fast" and not self._model.fast_available:
            raise ConfigError("the fast precision needs stored weights and our native kernel (a CPU with AVX2)")

    def switch(self, precision: str) -> bool:
        """Run in ``precision`` from now on (nothing waits any more); True where that changed it."""
        self.pending = None
        if precision == self._model.precision:
            return False
        self._model.precision = precision
        return True
