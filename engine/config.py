"""Speculative decoding settings: one immutable, validated object.

The UI hot-swaps settings by building a new ``SpecConfig`` with :meth:`SpecConfig.replace`;
validation happens there, so an invalid value never reaches a running session and the old
settings stay in force. Field names follow SGLang's server arguments (without the
``speculative_`` prefix) so that tuned values can be handed over unchanged.

A knob's default may depend on the method (its registration's ``defaults``: a block drafter drafts a
chain where the tree methods branch 4 ways). :meth:`SpecConfig.for_method` is the one rule for what a knob
the user did not set becomes, and :meth:`SpecConfig.with_method` applies it to a method switch (a
hot swap, the method read from a draft, one row of a bench); the field defaults below are
engine/knobs.py's, whatever the method.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from engine import methods
from engine.knobs import KNOBS, METHODS, ConfigError, default

__all__ = ["METHODS", "ConfigError", "SpecConfig", "knobs_for", "method_defaults"]

# a typing aid only: the registry (engine/methods.py) declares the methods, and
# tests/test_methods.py checks that this Literal names the same ones
Method = Literal["none", "ngram", "eagle", "eagle3", "standalone", "medusa", "dflash"]
MedusaTree = Literal["dynamic", "static"]
MEDUSA_TREES: tuple[str, ...] = KNOBS["medusa_tree"].choices
NgramMatchType = Literal["BFS", "PROB"]
NgramMode = Literal["tree", "chain"]
SamplingMode = Literal["coupled", "rejection"]
SAMPLINGS: tuple[str, ...] = KNOBS["sampling"].choices
ContextOverflow = Literal["refuse", "drop_oldest"]
CONTEXT_OVERFLOW: tuple[str, ...] = KNOBS["context_overflow"].choices

# The settings that act on each method (beyond temperature / top_p / max_new_tokens, which act on
# all), as each method's registration declares them. The CLI and the TUI both read this, so a knob
# that does nothing is never offered as if it did.
METHOD_KNOBS: dict[str, tuple[str, ...]] = {m.name: m.knobs for m in methods.all_methods()}
DRAFT_KNOBS: frozenset[str] = frozenset(k for knobs in METHOD_KNOBS.values() for k in knobs) | {"adaptive_draft"}


def method_knobs(method: str) -> tuple[str, ...]:
    """The knobs ``method``'s registration names (() for an unknown one)."""
    spec = methods.get(method)
    return spec.knobs if spec is not None else ()


def knobs_for(method: str) -> tuple[str, ...]:
    """The drafting knobs that act on ``method`` (adaptive_draft included when it drafts at all)."""
    knobs = method_knobs(method)
    return (*knobs, "adaptive_draft") if knobs else ()


def method_defaults(method: str) -> dict[str, Any]:
    """``method``'s own defaults (its registration's ``defaults``; {} for an unknown method), checked:
    a default for a knob the method does not read, or outside the knob's bounds, is a mistake in the
    registration (ValueError), met the first time the method is resolved."""
    spec = methods.get(method)
    if spec is None:
        return {}
    for name, value in spec.defaults.items():
        if name not in spec.knobs:
            raise ValueError(f"method {method!r} declares a default for {name!r}, a knob it does not read "
                             f"({', '.join(spec.knobs) or 'none'})")
        try:
            KNOBS[name].check(value)
        except ConfigError as exc:
            raise ValueError(f"method {method!r}'s default: {exc}") from None
    return dict(spec.defaults)


def drafting_knobs() -> frozenset[str]:
    """The knobs some registered method reads: those a method switch may give a new default."""
    return frozenset(k for m in methods.all_methods() for k in m.knobs)


@dataclass(frozen=True)
class SpecConfig:
    """Everything that shapes one answer; applied by a session at a step boundary."""

    method: Method = default("method")
    # SGLang: --speculative-num-steps (tree levels), --speculative-eagle-topk (branching),
    # --speculative-num-draft-tokens (tree size including the root).
    num_steps: int = default("num_steps")
    eagle_topk: int = default("eagle_topk")
    num_draft_tokens: int = default("num_draft_tokens")
    # SGLang n-gram flags: --speculative-ngram-*
    ngram_min_match_window_size: int = default("ngram_min_match_window_size")
    ngram_max_match_window_size: int = default("ngram_max_match_window_size")
    ngram_min_bfs_breadth: int = default("ngram_min_bfs_breadth")
    ngram_max_bfs_breadth: int = default("ngram_max_bfs_breadth")
    ngram_match_type: NgramMatchType = default("ngram_match_type")
    ngram_max_trie_depth: int = default("ngram_max_trie_depth")
    ngram_capacity: int = default("ngram_capacity")
    ngram_mode: NgramMode = default("ngram_mode")
    # specchat's own (SGLang has none): where the conversation has no match of 2+ tokens, draft
    # from a corpus of the model's own answers, when the session loaded one (--ngram-corpus)
    ngram_corpus: bool = default("ngram_corpus")
    # Medusa: "dynamic" = top-k Cartesian tree ranked by the product of head probabilities (eagle_topk,
    # num_steps); "static" = the Medusa paper's 63-node tree (mc_sim_7b_63) trimmed to num_draft_tokens
    medusa_tree: MedusaTree = default("medusa_tree")
    # Verify only the part of each tree expected to pay for its cost (engine/adaptive.py).
    adaptive_draft: bool = default("adaptive_draft")
    # sampling; temperature 0 means greedy
    temperature: float = default("temperature")
    top_p: float = default("top_p")
    top_k: int = default("top_k")
    # temperature > 0: "coupled" = drafter-invariant Gumbel-max sampling (engine/sampling.py),
    # "rejection" = recursive rejection sampling (engine/verify.py); both keep p exactly
    sampling: SamplingMode = default("sampling")
    seed: int | None = default("seed")
    max_new_tokens: int = default("max_new_tokens")
    # A turn whose prompt does not fit the model's context: refuse it, or drop the oldest turns.
    context_overflow: ContextOverflow = default("context_overflow")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` with a one-line, actionable message: each field against its
        declared bounds (engine/knobs.py), then the rules that tie fields together."""
        if methods.get(self.method) is None:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {', '.join(methods.names())}")
        for knob in KNOBS.values():
            knob.check(getattr(self, knob.name))
        drafts = self.num_draft_tokens - 1
        if methods.is_tree(self.method) and self.eagle_topk > drafts:
            # a wider level could not be kept, yet each further level would score topk² candidates (a
            # block drafter's tree scores no levels: a width past its node budget is never reached)
            raise ConfigError(f"eagle_topk={self.eagle_topk} is more than the tree holds: num_draft_tokens="
                              f"{self.num_draft_tokens} leaves room for {drafts} drafts; use eagle_topk {drafts} "
                              "or less, or raise num_draft_tokens")
        _not_below("ngram_max_match_window_size", self.ngram_max_match_window_size,
                   "ngram_min_match_window_size", self.ngram_min_match_window_size)
        if self.ngram_max_trie_depth <= self.ngram_max_match_window_size:
            raise ConfigError(
                "ngram_max_trie_depth must exceed ngram_max_match_window_size "
                f"(got {self.ngram_max_trie_depth} <= {self.ngram_max_match_window_size})"
            )
        _not_below("ngram_max_bfs_breadth", self.ngram_max_bfs_breadth,
                   "ngram_min_bfs_breadth", self.ngram_min_bfs_breadth)

    @property
    def tree_width(self) -> int:
        """Children kept per node of a drafted tree: the engine's name for SGLang's ``eagle_topk``
        (the field and its flag --speculative-eagle-topk keep SGLang's name, which every tree method
        reads, not only EAGLE)."""
        return self.eagle_topk

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def max_tree_tokens(self) -> int:
        """Nodes a verify forward may hold, root included (sizes the KV cache's scratch room)."""
        return 1 if self.method == "none" else self.num_draft_tokens

    @classmethod
    def for_method(cls, method: str, given: Mapping[str, Any] | None = None,
                   base: Mapping[str, Any] | None = None) -> SpecConfig:
        """``method``'s settings: ``given`` (what the user set: flags, a settings file, the settings
        panel) over the method's own defaults (:func:`method_defaults`) over ``base`` (values nobody
        chose for this method: a command's own defaults) over engine/knobs.py's.

        SGLang's rule on top: a tree method given top-k 1 and no tree size drafts a chain, so its tree
        holds ``num_steps + 1`` tokens, the root included (methods.chain_size)."""
        given = {k: v for k, v in (given or {}).items() if k != "method"}
        values = {**(base or {}), **method_defaults(method), **given, "method": method}
        if methods.is_tree(method) and given.get("eagle_topk") == 1 and "num_draft_tokens" not in given:
            values["num_draft_tokens"] = methods.chain_size(values.get("num_steps", default("num_steps")))
        return cls(**values)

    def with_method(self, method: str, kept: Collection[str] = ()) -> SpecConfig:
        """These settings switched to ``method`` (:meth:`for_method`): the knobs in ``kept`` (those the
        user set) keep their values, every other knob a method reads takes ``method``'s default, and the
        rest (sampling, answer length, the budget) stay as they are. Raises ConfigError, ``self``
        untouched, where a kept value does not fit the new method (a tree size too small for its top-k)."""
        values = self.to_dict()
        drafting = drafting_knobs()
        return SpecConfig.for_method(method, {k: values[k] for k in kept if k in values},
                                     {k: v for k, v in values.items() if k not in drafting})

    def chosen_knobs(self) -> frozenset[str]:
        """The knobs whose values differ from what :meth:`for_method` gives this method by default:
        somebody chose them (what counts as the user's where nobody says: an app handed a config)."""
        home = SpecConfig.for_method(self.method).to_dict()
        return frozenset(k for k, v in self.to_dict().items() if v != home[k])

    def replace(self, **changes: Any) -> SpecConfig:
        """A validated copy with ``changes``; raises ConfigError and leaves ``self`` untouched."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpecConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def sglang_args(self) -> list[str]:
        """The same settings as SGLang launch flags, for handing a tuned setup over: the knobs
        that act on the method and that SGLang has (engine/knobs.py names its flags)."""
        if self.method == "none":
            return []
        spec = methods.get(self.method)
        if spec is None or spec.sglang is None:  # SGLang has no such algorithm (Medusa; vLLM has: export says so)
            raise KeyError(self.method)
        args = [f"{KNOBS['method'].sglang} {spec.sglang}"]
        knobs = spec.knobs if spec.sglang_knobs is None else spec.sglang_knobs
        return args + [f"{KNOBS[n].sglang} {getattr(self, n)}" for n in knobs if KNOBS[n].sglang]


def _not_below(name: str, value: int, other: str, low: int) -> None:
    if value < low:
        raise ConfigError(f"{name} must be >= {other} (got {value} < {low})")
