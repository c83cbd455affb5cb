"""Speculative decoding settings: one immutable, validated object.

The UI hot-swaps settings by building a new ``SpecConfig`` with :meth:`SpecConfig.replace`;
validation happens there, so an invalid value never reaches a running session and the old
settings stay in force. Field names follow SGLang's server arguments (without the
``speculative_`` prefix) so that tuned values can be handed over unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from engine.errors import UserError

Method = Literal["none", "ngram", "eagle", "eagle3", "standalone", "medusa"]
METHODS: tuple[str, ...] = ("none", "ngram", "eagle", "eagle3", "standalone", "medusa")
MedusaTree = Literal["dynamic", "static"]
MEDUSA_TREES: tuple[str, ...] = ("dynamic", "static")
NgramMatchType = Literal["BFS", "PROB"]
NgramMode = Literal["tree", "chain"]
SamplingMode = Literal["coupled", "rejection"]
SAMPLINGS: tuple[str, ...] = ("coupled", "rejection")
ContextOverflow = Literal["refuse", "drop_oldest"]
CONTEXT_OVERFLOW: tuple[str, ...] = ("refuse", "drop_oldest")

# The settings that act on each method (beyond temperature / top_p / max_new_tokens, which act on
# all). The CLI and the TUI both read this, so a knob that does nothing is never offered as if it did.
_NGRAM_KNOBS = ("num_draft_tokens", "ngram_min_match_window_size", "ngram_max_match_window_size",
                "ngram_min_bfs_breadth", "ngram_max_bfs_breadth", "ngram_match_type", "ngram_max_trie_depth",
                "ngram_capacity", "ngram_mode", "ngram_corpus")
_TREE_KNOBS = ("num_steps", "eagle_topk", "num_draft_tokens")
METHOD_KNOBS: dict[str, tuple[str, ...]] = {
    "none": (),
    "ngram": _NGRAM_KNOBS,
    "eagle": _TREE_KNOBS,
    "eagle3": _TREE_KNOBS,
    "standalone": _TREE_KNOBS,
    "medusa": (*_TREE_KNOBS, "medusa_tree"),
}
DRAFT_KNOBS: frozenset[str] = frozenset(k for knobs in METHOD_KNOBS.values() for k in knobs) | {"adaptive_draft"}


def knobs_for(method: str) -> tuple[str, ...]:
    """The drafting knobs that act on ``method`` (adaptive_draft included when it drafts at all)."""
    knobs = METHOD_KNOBS.get(method, ())
    return (*knobs, "adaptive_draft") if knobs else ()


class ConfigError(UserError, ValueError):
    """A setting the engine cannot run with; the message says what to change."""


@dataclass(frozen=True)
class SpecConfig:
    """Everything that shapes one answer; applied by a session at a step boundary."""

    method: Method = "none"
    # SGLang: --speculative-num-steps (tree levels), --speculative-eagle-topk (branching),
    # --speculative-num-draft-tokens (tree size including the root).
    num_steps: int = 5
    eagle_topk: int = 4
    num_draft_tokens: int = 8
    # SGLang n-gram flags: --speculative-ngram-*
    ngram_min_match_window_size: int = 1
    ngram_max_match_window_size: int = 12
    ngram_min_bfs_breadth: int = 1
    ngram_max_bfs_breadth: int = 10
    ngram_match_type: NgramMatchType = "BFS"
    ngram_max_trie_depth: int = 18
    ngram_capacity: int = 200_000  # trie nodes; ~370 B each in the Python trie
    ngram_mode: NgramMode = "tree"
    # specchat's own (SGLang has none): where the conversation has no match of 2+ tokens, draft
    # from a corpus of the model's own answers, when the session loaded one (--ngram-corpus)
    ngram_corpus: bool = True
    # Medusa: "dynamic" = top-k Cartesian tree ranked by the product of head probabilities (eagle_topk,
    # num_steps); "static" = the Medusa paper's 63-node tree (mc_sim_7b_63) trimmed to num_draft_tokens
    medusa_tree: MedusaTree = "dynamic"
    # Verify only the part of each tree expected to pay for its cost (engine/adaptive.py).
    adaptive_draft: bool = True
    # sampling; temperature 0 means greedy
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut on the target's distribution
    # temperature > 0: "coupled" = drafter-invariant Gumbel-max sampling (engine/sampling.py),
    # "rejection" = recursive rejection sampling (engine/verify.py); both keep p exactly
    sampling: SamplingMode = "coupled"
    seed: int | None = None
    max_new_tokens: int = 512
    # A turn whose prompt does not fit the model's context: refuse it, or drop the oldest turns.
    context_overflow: ContextOverflow = "refuse"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` with a one-line, actionable message."""
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        _at_least("num_steps", self.num_steps, 1)
        _at_least("eagle_topk", self.eagle_topk, 1)
        _at_least("num_draft_tokens", self.num_draft_tokens, 2, hint="it counts the root, so 2 means one draft")
        if self.num_draft_tokens > 1024:
            raise ConfigError(f"num_draft_tokens={self.num_draft_tokens} is too large; use at most 1024")
        drafts = self.num_draft_tokens - 1
        if "eagle_topk" in METHOD_KNOBS[self.method] and self.eagle_topk > drafts:
            # a wider level could not be kept, yet each further level would score topk² candidates
            raise ConfigError(f"eagle_topk={self.eagle_topk} is more than the tree holds: num_draft_tokens="
                              f"{self.num_draft_tokens} leaves room for {drafts} drafts; use eagle_topk {drafts} "
                              "or less, or raise num_draft_tokens")
        _at_least("ngram_min_match_window_size", self.ngram_min_match_window_size, 1)
        if self.ngram_max_match_window_size < self.ngram_min_match_window_size:
            raise ConfigError(
                "ngram_max_match_window_size must be >= ngram_min_match_window_size "
                f"(got {self.ngram_max_match_window_size} < {self.ngram_min_match_window_size})"
            )
        if self.ngram_max_trie_depth <= self.ngram_max_match_window_size:
            raise ConfigError(
                "ngram_max_trie_depth must exceed ngram_max_match_window_size "
                f"(got {self.ngram_max_trie_depth} <= {self.ngram_max_match_window_size})"
            )
        _at_least("ngram_min_bfs_breadth", self.ngram_min_bfs_breadth, 1)
        if self.ngram_max_bfs_breadth < self.ngram_min_bfs_breadth:
            raise ConfigError(
                "ngram_max_bfs_breadth must be >= ngram_min_bfs_breadth "
                f"(got {self.ngram_max_bfs_breadth} < {self.ngram_min_bfs_breadth})"
            )
        if self.ngram_match_type not in ("BFS", "PROB"):
            raise ConfigError(f"ngram_match_type must be BFS or PROB, not {self.ngram_match_type!r}")
        if self.ngram_mode not in ("tree", "chain"):
            raise ConfigError(f"ngram_mode must be tree or chain, not {self.ngram_mode!r}")
        _at_least("ngram_capacity", self.ngram_capacity, 1000)
        if self.medusa_tree not in MEDUSA_TREES:
            raise ConfigError(f"medusa_tree must be dynamic or static, not {self.medusa_tree!r}")
        if not (0.0 <= self.temperature <= 10.0):
            raise ConfigError(f"temperature must be between 0 and 10, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        _at_least("top_k", self.top_k, 0, hint="0 turns the top-k cut off")
        if self.sampling not in SAMPLINGS:
            raise ConfigError(f"sampling must be coupled or rejection, not {self.sampling!r}")
        _at_least("max_new_tokens", self.max_new_tokens, 1)
        if self.context_overflow not in CONTEXT_OVERFLOW:
            raise ConfigError(f"context_overflow must be refuse or drop_oldest, not {self.context_overflow!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def max_tree_tokens(self) -> int:
        """Nodes a verify forward may hold, root included (sizes the KV cache's scratch room)."""
        return 1 if self.method == "none" else self.num_draft_tokens

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
        """The same settings as SGLang launch flags, for handing a tuned setup over."""
        if self.method == "none":
            return []
        # KeyError for medusa: SGLang has no Medusa algorithm (vLLM has; specchat/export.py says so)
        algo = {"ngram": "NGRAM", "eagle": "EAGLE", "eagle3": "EAGLE3", "standalone": "STANDALONE"}[self.method]
        args = [f"--speculative-algorithm {algo}"]
        if self.method == "ngram":
            args += [
                f"--speculative-num-draft-tokens {self.num_draft_tokens}",
                f"--speculative-ngram-min-match-window-size {self.ngram_min_match_window_size}",
                f"--speculative-ngram-max-match-window-size {self.ngram_max_match_window_size}",
                f"--speculative-ngram-min-bfs-breadth {self.ngram_min_bfs_breadth}",
                f"--speculative-ngram-max-bfs-breadth {self.ngram_max_bfs_breadth}",
                f"--speculative-ngram-match-type {self.ngram_match_type}",
                f"--speculative-ngram-max-trie-depth {self.ngram_max_trie_depth}",
            ]
        else:
            args += [
                f"--speculative-num-steps {self.num_steps}",
                f"--speculative-eagle-topk {self.eagle_topk}",
                f"--speculative-num-draft-tokens {self.num_draft_tokens}",
            ]
        return args


def _at_least(name: str, value: int, low: int, hint: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        extra = f" ({hint})" if hint else ""
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}{extra}")
