"""From the command-line flags to what the engine takes: one mapping for every command.

Why one module: ``generate``, ``bench``, ``run`` (the TUI), the GPU bench and train-draft all read
the same speculative flags, and when each built its own SpecConfig they drifted (the TUI skipped
SGLang's top-k 1 rule and the draft-implies-method default). They all call :func:`make_config`
and :func:`draft_options` here, and raise :class:`UsageError` for a mistake in the flags.

It sits below the commands and above the engine: it imports nothing of ``specchat.cli`` (the
parser imports it), and nothing heavy at import time, so ``specchat --help`` stays instant.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import methods
from engine.errors import UserError
from engine.knobs import KNOBS, Knob
from engine.outputs import WRITTEN_BY

if TYPE_CHECKING:
    from engine.config import SpecConfig
    from specchat.command_options import CommandOptions, SpecOptions

# --method names (any case) -> SpecConfig.method, from the registry: each method's name and aliases
# ("eagle2" is SGLang's name for EAGLE-1/2 heads)
ALGORITHMS: dict[str, str] = methods.aliases()
TREE_METHODS: tuple[str, ...] = methods.tree_methods()  # SGLang's top-k 1 rule applies to these
# --threads: more than a few per core only slows torch down; the cap refuses a typo (400 for 4)
MAX_THREADS = 4 * (os.cpu_count() or 1)


class UsageError(UserError):
    """Bad input from the user: printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors raised as UsageError: the CLI prints them as one line (exit 2),
    like every other mistake in the flags, instead of the usage block and a second line."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


def add_knob_flags(p: argparse.ArgumentParser) -> None:
    """One flag per knob that has one (engine/knobs.py): its name, help, type and bounds, checked
    as it is parsed, before any work."""
    for knob in KNOBS.values():
        if knob.flag is None:
            continue
        if knob.kind is bool:
            p.add_argument(knob.flag, *knob.flag_aliases, dest=knob.name, action=argparse.BooleanOptionalAction,
                           default=None, help=f"{knob.help} (default: {'on' if knob.default else 'off'})")
            continue
        metavar = "|".join(knob.choices) if knob.choices else None
        p.add_argument(knob.flag, *knob.flag_aliases, dest=knob.name, type=knob_type(knob), default=None,
                       metavar=metavar, help=f"{knob.help} ({_allowed(knob)})")


def add_force_flag(p: argparse.ArgumentParser, replaces: str, without: str = "refused before any work") -> None:
    """``--force``: the one way to let a command replace an existing output the user did not ask it to
    replace (engine/outputs.py says what it replaces without asking). ``replaces``: what, in the help;
    ``without``: what happens to it without the flag."""
    p.add_argument("--force", action="store_true", help=f"replace an existing {replaces} (without --force: {without})")


def _allowed(knob: Knob) -> str:
    """The values and the default, with each method's own (``default 4; <method>: 1``)."""
    shown = "none" if knob.default is None else knob.default
    own = [f"{m.name}: {m.defaults[knob.name]}" for m in methods.all_methods() if knob.name in m.defaults]
    default = "; ".join([f"default {shown}", *own])
    return default if knob.choices else f"{knob.describe()}; {default}"


def knob_type(knob: Knob):
    """argparse's ``type`` for ``knob``: text -> a value within its bounds, else ArgumentTypeError
    (argparse then names the flag)."""

    def convert(text: str) -> Any:
        if knob.choices:
            value = knob.canonical(text)
            if value is None:
                raise argparse.ArgumentTypeError(f"unknown {knob.name} {text!r}; choose {', '.join(knob.choices)}")
            return value
        try:
            value = knob.kind(text)
        except ValueError:
            value = None
        if value is None or not knob.accepts_type(value) or not knob.in_range(value):
            raise argparse.ArgumentTypeError(f"must be {knob.describe()}, got {text!r}{knob.advice(value)}")
        return value

    convert.__name__ = knob.name
    return convert


def bounded(kind: type, low: float | None = None, high: float | None = None, *, low_open: bool = False):
    """argparse's ``type`` for a numeric flag that is no knob (--threads, --speed, --max-steps...):
    the same check and wording as the knobs'."""
    return knob_type(Knob("value", kind, None, "", None, low=low, high=high, low_open=low_open))


def spec_overrides(spec: SpecOptions) -> dict[str, Any]:
    """The SpecConfig fields the user set on the command line (flags left unset are absent).

    The parser already checked each value (:func:`knob_type`); a choice is canonicalised again
    here for options built by other means (a test, or ``dataclasses.replace``)."""
    out: dict[str, Any] = {}
    for name, given in spec.knobs.items():
        knob = KNOBS[name]
        value = knob.canonical(str(given)) if knob.choices else given
        if value is None:
            raise UsageError(f"unknown {name} {given!r}; choose {', '.join(knob.choices)}")
        out[name] = value
    return out


def given_knobs(spec: SpecOptions) -> dict[str, Any]:
    """The settings the user set: the flags given, over the fields of ``--settings FILE``. They win over
    every default, and keep their values when the method changes (SpecConfig.with_method)."""
    return {**settings_from(spec), **spec_overrides(spec)}


def make_config(spec: SpecOptions, **defaults: Any) -> SpecConfig:
    """The SpecConfig for the flags in ``spec``: the flags given, over ``--settings FILE`` (a JSON of
    SpecConfig fields, as ``specchat tune --save-settings`` writes), over the method's own defaults
    (its registration's: a block drafter's chain), over the command's ``defaults`` (SpecConfig.for_method).
    Two rules beyond copying values, applied for every command alike:

    * ``--speculative-draft-model-path`` without ``--method`` leaves the method to the loader,
      which infers it from the draft (the config says "none" until then; the loader applies the
      inferred method's defaults to what the user left unset: draft_options' ``given``);
    * SGLang's rule: a tree method given ``--speculative-eagle-topk 1`` and no tree size drafts a
      chain, so the tree holds ``num_steps + 1`` tokens (root included).

    Raises UsageError for an unknown method and ConfigError (both one line) for invalid values.
    """
    from engine.config import SpecConfig

    given = given_knobs(spec)
    if "method" not in given and spec.draft and defaults.get("method") != "none":
        defaults = {**defaults, "method": "none"}  # until load_session infers the method from the draft
    return SpecConfig.for_method(given.get("method", defaults.get("method", KNOBS["method"].default)), given,
                                 defaults)


def draft_options(options: CommandOptions) -> dict[str, Any]:
    """load_session's draft arguments for a command's options.

    ``bench`` and ``tune`` time the methods they list, so there the draft never picks the method;
    nor where a settings file names it."""
    spec = options.spec
    explicit = spec.knob("method") is not None or "method" in settings_from(spec)
    return {
        "also": options.also_runs(),
        "draft": spec.draft,
        "draft_revision": spec.draft_revision,
        "token_map": spec.token_map,
        "ngram_corpus": spec.ngram_corpus or "auto",
        "method_from_draft": bool(spec.draft) and not explicit and not options.times_methods,
        "given": frozenset(given_knobs(spec)),  # kept when the method read from the draft brings its defaults
    }


def settings_from(spec: SpecOptions) -> dict[str, Any]:
    """The fields of ``--settings FILE`` ({} without one), checked: see :func:`load_settings`."""
    return load_settings(spec.settings) if spec.settings else {}


def load_settings(path: str | Path) -> dict[str, Any]:
    """A settings file: one JSON object of SpecConfig fields (``tune --save-settings`` writes them).

    Refused in one line, naming the file and what to fix: a missing or unreadable file, a FIFO or a
    device (never read: it would block or never end), a file over 1 MiB, not JSON (too deeply nested,
    an integer over Python's digit limit included), an unknown field, a value of the wrong type or out of range."""
    import dataclasses

    from engine.config import ConfigError, SpecConfig
    from engine.files import SMALL_LIMIT, UnreadableFileError, read_text
    from engine.jsonl import loads

    try:
        data = loads(read_text(path, limit=SMALL_LIMIT, what="a settings file (JSON)"))
    except (FileNotFoundError, UnreadableFileError) as exc:  # missing, a FIFO or a device, over 1 MiB
        raise UsageError(f"--settings {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--settings {path}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--settings {path}: not JSON ({exc.msg}, line {exc.lineno}); "
                         "write one object of settings") from None
    if not isinstance(data, dict):
        raise UsageError(f"--settings {path}: write one JSON object of settings, e.g. {{\"method\": \"ngram\"}}")
    data = {k: v for k, v in data.items() if k != WRITTEN_BY}  # the mark of tune --save-settings (engine/outputs.py)
    defaults = {f.name: f.default for f in dataclasses.fields(SpecConfig)}
    for name, value in data.items():
        if name not in defaults:
            raise UsageError(f"--settings {path}: unknown setting {name!r}; settings are SpecConfig fields "
                             f"({', '.join(defaults)})")
        if not _same_kind(value, defaults[name]):
            raise UsageError(f"--settings {path}: {name} takes {_kind(defaults[name])}, not {value!r}")
    try:
        SpecConfig(**data)
    except ConfigError as exc:
        raise UsageError(f"--settings {path}: {exc}") from None
    return data


def _kind(default: Any) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        type(default), "an integer or null")  # seed, whose default is None


def _same_kind(value: Any, default: Any) -> bool:
    """JSON's types against the field's (its default's): true is no integer, 1 is a float."""
    if default is None:
        return value is None or (isinstance(value, int) and not isinstance(value, bool))
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(default))
