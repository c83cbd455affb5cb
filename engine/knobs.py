"""Every setting of an answer, declared once: type, bounds, default, help, flag, SGLang name.

Why one table: the settings used to be declared four times (SpecConfig, the CLI's flag list, the
TUI's settings schema and a developer entry point), with help texts and bounds that drifted, so
``--speculative-num-steps 99999`` was accepted and drafted 99,999 levels a step. Now
:class:`~engine.config.SpecConfig` takes its fields, defaults and validation from :data:`KNOBS`;
the CLI (specchat/cli_flags.py) generates its flags, the TUI its settings schema and palette
commands, and ``export`` its SGLang flags from the same entries; tests/test_knobs.py checks that
they agree.

Bounds are chosen to hold every real use and nothing that hangs: the largest tree a step may
verify is one forward the session cannot interrupt, and each drafting level is checked for a
cancel (engine/session.py), so Esc acts within about a second even at the largest settings.
It lives in the engine, with no app imports, so SpecConfig validates from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine import methods
from engine.errors import UserError

# the registered methods (engine/methods.py) when this table is built: --method's choices
METHODS: tuple[str, ...] = methods.names()
# SGLang's --speculative-algorithm values, for the methods SGLang has
SGLANG_ALGORITHMS: dict[str, str] = {m.name: m.sglang for m in methods.all_methods() if m.sglang}


class ConfigError(UserError, ValueError):
    """A setting the engine cannot run with; the message says what to change."""


@dataclass(frozen=True)
class Knob:
    """One setting: what it is, what it may be, and how each surface spells it."""

    name: str  # the SpecConfig field (SGLang's server argument without "speculative_")
    kind: type  # int, float, str (a choice) or bool
    default: Any
    help: str  # one text for the CLI's --help and the TUI's palette
    flag: str | None  # the command-line flag (SGLang's where it has one); None: no flag, `why` says
    sglang: str | None = None  # SGLang's launch flag, where SGLang has this setting with this meaning
    low: float | None = None  # bounds, inclusive (low exclusive where low_open)
    high: float | None = None
    low_open: bool = False
    # values above 0 and below this are refused, 0 itself allowed (temperature: 0 is greedy, 1e-38 overflows)
    least_nonzero: float | None = None
    zero_means: str = ""  # what 0 does, said where a value too near it is refused ("greedy")
    choices: tuple[str, ...] = ()
    value_aliases: tuple[tuple[str, str], ...] = ()  # other names of a choice (eagle2 -> eagle)
    optional: bool = False  # None is a value too (seed: none = a fresh one each answer)
    label: str | None = None  # the settings panel's row label; None: not a row (CLI / settings file only)
    flag_aliases: tuple[str, ...] = ()  # other spellings of the flag
    why: str = ""  # why these bounds

    def check(self, value: Any) -> None:
        """Raise ConfigError (one line: the range and the flag) unless ``value`` is allowed."""
        if value is None and self.optional:
            return
        if not self.accepts_type(value):
            raise ConfigError(f"{self.name} must be {self.describe()}{self._flag_note()}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{self.name} must be one of {', '.join(self.choices)}{self._flag_note()}, "
                              f"got {value!r}")
        if self.kind in (int, float) and not self.in_range(value):
            raise ConfigError(f"{self.name} must be {self.describe()}{self._flag_note()}, got {value!r}"
                              f"{self.advice(value)}")

    def accepts_type(self, value: Any) -> bool:
        """bool is no int; an int is a float; a float must be finite."""
        if self.kind is bool:
            return isinstance(value, bool)
        if isinstance(value, bool):
            return False
        if self.kind is float:
            return isinstance(value, (int, float)) and math.isfinite(value)
        return isinstance(value, self.kind)

    def in_range(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.least_nonzero is not None and 0 < value < self.least_nonzero:
            return False
        return self.high is None or value <= self.high

    def advice(self, value: Any) -> str:
        """What to type instead of a value just above 0 (``least_nonzero``): "" for any other."""
        if self.least_nonzero is None or not self.accepts_type(value) or not 0 < value < self.least_nonzero:
            return ""
        return f"; use {self.flag or self.name} 0 for {self.zero_means or 'off'}"

    def describe(self) -> str:
        """What values are allowed, in words: 'an integer from 1 to 32'."""
        if self.kind is bool:
            return "true or false"
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        noun = "an integer" if self.kind is int else "a number"
        low = _num(self.low)
        if self.low is not None and self.high is not None:
            span = f"above {low} and up to {_num(self.high)}" if self.low_open else f"from {low} to {_num(self.high)}"
        elif self.low is not None:
            span = f"above {low}" if self.low_open else f">= {low}"
        else:
            span = f"<= {_num(self.high)}" if self.high is not None else ""
        extra = " or none" if self.optional else ""
        if self.least_nonzero is not None:
            extra += f" (0 = {self.zero_means or 'off'}; otherwise at least {_num(self.least_nonzero)})"
        return f"{noun} {span}{extra}".strip()

    def canonical(self, text: str) -> str | None:
        """A choice typed in any case, or one of its aliases -> the choice; None if none matches."""
        key = text.strip().lower()
        for alias, value in self.value_aliases:
            if key == alias:
                return value
        return next((c for c in self.choices if c.lower() == key), None)

    def _flag_note(self) -> str:
        return f" ({self.flag})" if self.flag else ""


def _num(x: float | None) -> str:
    if x is None:
        return ""
    return f"{int(x):,}".replace(",", "_") if float(x).is_integer() and abs(x) >= 100_000 else f"{x:g}"


_TREE_COST = ("each level is one drafter forward on up to eagle_topk nodes, and the session looks for "
              "a cancel before each level")
_NGRAM_WINDOW = "the n-gram search matches each window size once per step; 64 tokens is past any useful match"

_KNOBS: tuple[Knob, ...] = (
    Knob("method", str, "none", f"drafting method: {methods.listed([m.help_name for m in methods.all_methods()])}; "
         "with --draft and no method, inferred from the draft", "--method",
         sglang="--speculative-algorithm", choices=METHODS,
         value_aliases=tuple((a, m.name) for m in methods.all_methods() for a in m.aliases), label="method",
         flag_aliases=("--speculative-algorithm",)),
    Knob("num_steps", int, 5, "tree depth: levels the drafter guesses ahead per step (EAGLE, standalone, Medusa)",
         "--speculative-num-steps", sglang="--speculative-num-steps", low=1, high=32, label="num_steps",
         why=f"SGLang's tuned settings use 3-8 and the acceptance of a level past ~10 is nil; {_TREE_COST}"),
    Knob("eagle_topk", int, 4, "branching: candidates kept per node of the draft tree",
         "--speculative-eagle-topk", sglang="--speculative-eagle-topk", low=1, high=64, label="eagle_topk",
         why="64 is the widest top-k the CPU kernel's perturbed picks take (engine/kernels ops.c); a level "
             "scores topk² candidates, 4,096 at most"),
    Knob("num_draft_tokens", int, 8, "tree size per step, the root included (2 = one draft)",
         "--speculative-num-draft-tokens", sglang="--speculative-num-draft-tokens", low=2, high=64,
         label="num_draft_tokens",
         why="SGLang's largest tuned trees (and EAGLE-2's, 60 tokens) fit; the verify of one tree is the one "
             "forward a cancel cannot interrupt: at 64 tokens (32 levels, topk 63) Esc ended the answer in 0.6 s "
             "with SmolLM2-135M on a busy 2-core CPU, at 256 in 7 s"),
    Knob("ngram_min_match_window_size", int, 1, "n-gram: shortest suffix matched",
         "--speculative-ngram-min-match-window-size", sglang="--speculative-ngram-min-match-window-size",
         low=1, high=64, label="ngram min window", why=_NGRAM_WINDOW),
    Knob("ngram_max_match_window_size", int, 12, "n-gram: longest suffix matched",
         "--speculative-ngram-max-match-window-size", sglang="--speculative-ngram-max-match-window-size",
         low=1, high=64, label="ngram max window", why=_NGRAM_WINDOW),
    Knob("ngram_min_bfs_breadth", int, 1, "n-gram: fewest branches per level",
         "--speculative-ngram-min-bfs-breadth", sglang="--speculative-ngram-min-bfs-breadth", low=1, high=64,
         label="ngram min breadth", why="a level never holds more than the tree (num_draft_tokens)"),
    Knob("ngram_max_bfs_breadth", int, 10, "n-gram: most branches per level",
         "--speculative-ngram-max-bfs-breadth", sglang="--speculative-ngram-max-bfs-breadth", low=1, high=64,
         label="ngram max breadth", why="a level never holds more than the tree (num_draft_tokens)"),
    Knob("ngram_match_type", str, "BFS", "n-gram: BFS (recency) or PROB (frequency)",
         "--speculative-ngram-match-type", sglang="--speculative-ngram-match-type", choices=("BFS", "PROB")),
    Knob("ngram_max_trie_depth", int, 18, "n-gram: longest stored suffix (more than the longest match window)",
         "--speculative-ngram-max-trie-depth", sglang="--speculative-ngram-max-trie-depth", low=2, high=128,
         why="each committed token inserts one path this deep; past the match window it only costs memory"),
    Knob("ngram_capacity", int, 200_000, "n-gram: trie node budget (~370 bytes a node)",
         "--speculative-ngram-capacity", low=1000, high=10_000_000,
         why="10 million nodes is about 3.7 GB in the Python trie; SGLang's flag of this name counts tokens, "
             "so it is not handed over"),
    Knob("ngram_mode", str, "tree", "n-gram: tree (SGLang's trie) or chain (prompt lookup)",
         "--speculative-ngram-mode", choices=("tree", "chain")),
    Knob("ngram_corpus", bool, True, "n-gram: where the conversation has no match, draft from the model's own "
         "answers", None, label="ngram corpus",
         why="no flag: --ngram-corpus names the corpus folders (none turns it off)"),
    Knob("medusa_tree", str, "dynamic", "Medusa: dynamic (top-k product of the heads) or static (the paper's "
         "63-node tree)", "--speculative-medusa-tree", choices=("dynamic", "static"), label="medusa tree"),
    Knob("adaptive_draft", bool, True, "verify only the part of each draft tree expected to pay (off in "
         "teaching mode)", "--adaptive-draft", label="adaptive draft"),
    Knob("temperature", float, 0.0, "0 = greedy (identical to the baseline)", "--temperature", low=0, high=10,
         least_nonzero=1e-3, zero_means="greedy", label="temperature",
         why="past 10 every distribution is flat noise; below 0.001 it is greedy in all but name, and the "
             "logits divided by 1e-38 overflow to inf (every token then tied): 0 says greedy"),
    Knob("top_p", float, 1.0, "nucleus sampling cut-off", "--top-p", low=0, high=1, low_open=True, label="top_p"),
    Knob("top_k", int, 0, "sample among the k likeliest (0 = off)", "--top-k", low=0, high=262_144,
         why="262,144 is the largest vocabulary of a supported family (Gemma 3)"),
    Knob("sampling", str, "coupled", "temperature > 0: coupled (the answer depends only on the seed, not on "
         "the drafter) or rejection (recursive rejection sampling)", "--sampling", choices=("coupled", "rejection"),
         label="sampling"),
    Knob("seed", int, None, "the sampling seed (none: a fresh one each answer)", "--seed", low=0, high=2**63 - 1,
         optional=True, why="torch's generators take a 64-bit seed"),
    Knob("max_new_tokens", int, 512, "answer length limit, in tokens (at most the model's context)",
         "--max-new-tokens", low=1, high=1 << 20, label="max_new_tokens",
         why="the session also refuses more than the model's context once it is known; 1,048,576 is past "
             "every supported model's context, and refuses 10**12 before any model loads"),
    Knob("context_overflow", str, "refuse", "a turn that does not fit the context: refuse it, or drop the "
         "oldest turns", "--context-overflow", choices=("refuse", "drop_oldest"), label="context overflow"),
)

KNOBS: dict[str, Knob] = {k.name: k for k in _KNOBS}


def default(name: str) -> Any:
    """The declared default of ``name`` (SpecConfig's fields read theirs from here)."""
    return KNOBS[name].default
