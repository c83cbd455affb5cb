"""A session's drafters: the methods it can run, the settings in force and those waiting to be
hot-swapped in, and the target features the feature-reading drafters are given.

Why together: which settings are accepted depends on the drafters (a method must be installed, a
top-k must fit its draft vocabulary), and which target features the forwards capture depends on
the method drafting. A refused hot-swap or draft leaves the old in force: every check runs before
anything changes.

Drafters are made afresh for every conversation, but a drafter's CUDA graphs and the draft cache
they read (engine/gpu/graphs.py, DraftMemory) pass to the next drafter of the same draft: they are
captured once per draft, not once per prompt, and go when the draft is replaced.
"""

from __future__ import annotations

from collections.abc import Callable

from engine import methods
from engine.config import ConfigError, SpecConfig
from engine.conversation import check_answer_length
from engine.drafters.base import Drafter
from engine.features import FeatureCapture, FeatureCaptures, FeatureSpec
from engine.gpu.graphs import DraftMemory, GraphCounts, KeepsGraphs
from engine.method_spec import resolve

DrafterFactory = Callable[[], Drafter]


def default_drafters() -> dict[str, DrafterFactory]:
    """The drafters every session has: those of the registered methods that take no draft."""
    return {m.name: resolve(m.drafter) for m in methods.all_methods() if m.drafter}


class Drafters:
    """The installed drafters (made on first use), the settings, and the feature captures."""

    def __init__(self, factories: dict[str, DrafterFactory] | None, config: SpecConfig,
                 features: FeatureSpec | None, context_limit: int | None = None) -> None:
        self.context_limit = context_limit  # the target's context: no answer may be longer
        self._factories = factories if factories is not None else default_drafters()
        self._made: dict[str, Drafter] = {}
        # the graphs and caches of forgotten drafters, for the next drafter of each method; the
        # counts of those released with their draft (the session's counts are "so far")
        self._kept: dict[str, DraftMemory] = {}
        self._released = GraphCounts(0, 0)
        self._room = 0  # tokens the caches hold room for (reserve)
        # target states the drafters read (EAGLE and Medusa heads), one row per cached token,
        # captured only while a method that reads them drafts (engine/features.py says why): one
        # store per kind of state, so an EAGLE-3 head and Medusa heads can share one session
        self._default_features = features  # what a feature-reading drafter reads unless install() says
        self._features: dict[str, FeatureSpec | None] = {}
        self.captures = FeatureCaptures()
        self.capture: FeatureCapture = self.captures.off  # the capture of the method drafting now
        self.check(config)
        self.config = config  # the settings in force
        self.pending: SpecConfig | None = None  # accepted while an answer streams, applied at a step boundary
        self.version = 0  # counts the settings applied, for the Step events

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def get(self, method: str) -> Drafter:
        if method not in self._made:
            drafter = self._factories[method]()
            kept = self._kept.pop(method, None)
            if isinstance(drafter, KeepsGraphs):
                if kept is not None and kept.owner is drafter.memory.owner:
                    drafter.memory, kept = kept, None
                drafter.memory.reserve(self._room)
            self._release(kept)
            self._made[method] = drafter
        return self._made[method]

    def check(self, config: SpecConfig) -> None:
        """Refuse a method this session cannot run, or settings its drafter cannot honour (a top-k
        beyond the draft vocabulary), up front: a refused hot-swap leaves the old settings."""
        if config.method not in self._factories:
            have = ", ".join(self._factories)
            hint = " (load a draft with --draft)" if methods.takes_draft(config.method) else ""
            raise ConfigError(f"method {config.method!r} is not available in this session{hint}; have: {have}")
        if self.context_limit is not None:
            check_answer_length(config, self.context_limit)
        self.get(config.method).check(config)

    def checked(self, config: SpecConfig | None) -> SpecConfig:
        """The settings for an answer or a hot-swap: ``config`` validated and checked against the
        drafters (raising ConfigError before anything changes), or those in force."""
        if config is None:
            return self.config
        config.validate()
        self.check(config)
        return config

    def apply(self, config: SpecConfig) -> None:
        """Put ``config`` (checked) in force; what was pending is superseded."""
        self.config = config
        self.pending = None
        self.version += 1

    def install(self, method: str, factory: DrafterFactory, features: FeatureSpec | None) -> None:
        """Add (or replace) ``method``'s drafter, made on first use. The drafters already installed
        keep theirs: a head that reads other target features than the cached ones gets its own
        store, filled by a catch-up when its method first drafts."""
        self._factories = {**self._factories, method: factory}
        self._features[method] = features
        self._release(self._kept.pop(method, None))
        old = self._made.pop(method, None)
        self._release(old.memory if isinstance(old, KeepsGraphs) else None)

    def forget(self) -> None:
        """Drop every drafter's state (a new conversation, another precision): made again on use,
        with the graphs and cache of the drafter before (DraftMemory)."""
        self._kept.update({m: d.memory for m, d in self._made.items() if isinstance(d, KeepsGraphs)})
        self._made.clear()

    def reserve(self, tokens: int) -> None:
        """Room in every draft cache for a conversation of ``tokens``, now and in those made later
        (Session.reserve: graphs are captured per cache address)."""
        self._room = max(self._room, tokens)
        for memory in self._memories():
            memory.reserve(self._room)

    def graph_counts(self) -> GraphCounts:
        """The drafters' graphs captured and replayed so far (those released with their draft too)."""
        counts = self._released
        for memory in self._memories():
            counts += memory.counts()
        return counts

    def features_of(self, method: str) -> FeatureSpec | None:
        """The target features ``method``'s drafter reads; None for one that reads none."""
        return self._features.get(method, self._default_features) if self.get(method).needs_features else None

    def use_capture(self, method: str) -> FeatureCapture:
        """Forwards capture the target features ``method``'s drafter reads from now on (nothing for
        a drafter that reads none); the other stores keep their rows for the prefix they cover."""
        spec = self.features_of(method)
        capture = self.captures.get(spec)
        if capture is not self.capture:
            self.capture.set(False)
            self.capture = capture
        capture.set(spec is not None)
        return capture

    def _memories(self) -> list[DraftMemory]:
        return [*self._kept.values(), *(d.memory for d in self._made.values() if isinstance(d, KeepsGraphs))]

    def _release(self, memory: DraftMemory | None) -> None:
        """Let ``memory``'s graphs and cache go (its draft was replaced), its counts kept."""
        if memory is not None:
            self._released += memory.counts()
