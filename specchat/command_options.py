"""What each command reads, as frozen dataclasses built once from the parsed flags.

Why: the argparse Namespace is an untyped bag; read past the parser it invited
``getattr(args, "x", None)`` guesses (a flag renamed or missing read as None, silently) and writes
back into it (a resolved precision left for a factory to read later). Here every command's options
are declared as fields, built right after parsing by :func:`from_namespace`, which fails loudly
when the parser lacks a field; the commands and everything below them read typed attributes, and
a change (the precision ``run`` resolved) is a new object (``dataclasses.replace``).

The field names are the parser's ``dest`` names, so :func:`flatten` turns an options object back
into them (``serve`` hands each browser tab the ``run`` flags it was given). Nothing heavy is
imported: the CLI builds these before any command module loads.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine.knobs import KNOBS

# the knobs with a flag, whose values SpecOptions.knobs holds (by SpecConfig field name)
KNOB_FLAGS: tuple[str, ...] = tuple(k.name for k in KNOBS.values() if k.flag is not None)


@dataclass(frozen=True)
class ModelOptions:
    """The target model and how it loads (every command that names a model)."""

    model: str | None
    revision: str | None
    dtype: str
    device: str
    weights: str
    precision: str
    backend: str
    threads: int | None
    allow_pickle: bool

    def load_args(self, **overrides: Any) -> dict[str, Any]:
        """``engine.loader.load_session``'s keywords for this target (the model is its first argument);
        ``overrides`` for the one --weights and --precision a session takes where the flag lists several."""
        return {"dtype": self.dtype, "device": self.device, "backend": self.backend, "allow_pickle": self.allow_pickle,
                "threads": self.threads, "revision": self.revision, "weights": self.weights,
                "precision": self.precision, **overrides}


@dataclass(frozen=True)
class SpecOptions:
    """The speculative flags: the draft, ``--settings FILE`` and the knobs given on the command line."""

    draft: str | None
    draft_revision: str | None
    token_map: str | None
    ngram_corpus: str | None
    settings: str | None
    knobs: Mapping[str, Any] = field(default_factory=dict)  # only the knob flags given (engine/knobs.py names)

    def knob(self, name: str) -> Any:
        """The value of knob ``name`` given as a flag, else None."""
        return self.knobs.get(name)


@dataclass(frozen=True)
class CommandOptions:
    """A command that names a target and speculative settings (run, serve, generate, bench, tune, export)."""

    target: ModelOptions
    spec: SpecOptions
    # bench and tune time the methods they list: there a draft never picks the method in force
    times_methods: ClassVar[bool] = False

    def also_runs(self) -> tuple[str, ...]:
        """Methods run besides the one in force: the loader installs the heads shipped for them."""
        return ()

    def loads_target(self) -> bool:
        """Whether the command reads the target's files (preflight checks them first)."""
        return True


@dataclass(frozen=True)
class RunOptions(CommandOptions):
    """``specchat run``: the chat TUI."""

    theme: str | None
    fake: bool
    compare: str | None  # "" for --compare alone: the baseline against the method in force
    teach: bool
    record: str | None
    force: bool  # --record may replace an existing trace

    def also_runs(self) -> tuple[str, ...]:
        return method_list(self.compare)

    def loads_target(self) -> bool:
        return not self.fake


@dataclass(frozen=True)
class ServeOptions(RunOptions):
    """``specchat serve``: run's options, handed to each browser tab, and the server's own."""

    host: str
    port: int
    max_sessions: int | None
    public_url: str | None
    run_parser: argparse.ArgumentParser  # run's own parser: a tab takes exactly the flags `run` takes

    def run_options(self) -> RunOptions:
        """The options of ``specchat run`` that each tab gets."""
        names = [f.name for f in dataclasses.fields(RunOptions)]
        return RunOptions(**{name: getattr(self, name) for name in names})


@dataclass(frozen=True)
class GenerateOptions(CommandOptions):
    """``specchat generate``: one prompt answered in the terminal."""

    prompt: str | None
    prompt_file: str | None
    raw: bool
    json: bool


@dataclass(frozen=True)
class BenchOptions(CommandOptions):
    """``specchat bench``: methods timed against the baseline."""

    prompts: str | None
    methods: str | None
    peers: str
    limit: int | None
    rounds: int  # every row run this many times, in alternated order (bench.py: _time_rounds)
    json_out: str | None
    plot: str | None
    cost_curve: bool
    context: int
    data_engine: int | None
    train_speed: bool
    rows: int
    random_weights: str | None
    peak_bandwidth: float | None
    tui: int | None  # --tui N: the chat's streaming against the engine, N pairs (bench_tui.py)
    force: bool  # --json / --plot may replace a file bench did not write
    times_methods: ClassVar[bool] = True

    def other_benchmark(self) -> str | None:
        """The flag of the benchmark that is not the method table, if one is given: the one place that
        says which flags choose another benchmark (their refusals name it)."""
        return next((flag for flag, given in (
            ("--random-weights", self.random_weights is not None), ("--data-engine", self.data_engine is not None),
            ("--train-speed", self.train_speed), ("--cost-curve", self.cost_curve), ("--tui", self.tui is not None))
            if given), None)

    def also_runs(self) -> tuple[str, ...]:
        return method_list(self.methods)

    def loads_target(self) -> bool:
        return self.random_weights is None


@dataclass(frozen=True)
class TuneOptions(CommandOptions):
    """``specchat tune``: the knobs swept on the user's prompts."""

    prompts: str
    methods: str
    grid: str | None
    minutes: float | None
    limit: int | None
    json_out: str | None
    save_settings: str | None
    force: bool  # --json / --save-settings may replace a file tune did not write
    times_methods: ClassVar[bool] = True


@dataclass(frozen=True)
class ExportOptions(CommandOptions):
    """``specchat export``: a server's launch line (no model is loaded)."""

    server: str

    def loads_target(self) -> bool:
        return False


@dataclass(frozen=True)
class ReplayOptions:
    """``specchat replay``: a recorded trace played in the TUI."""

    trace: str
    speed: float
    step: bool
    theme: str | None


@dataclass(frozen=True)
class TrainDraftOptions:
    """``specchat train-draft``: a draft head trained on the target's own answers."""

    model: str | None
    out: str | None
    method: str
    medusa_heads: int | None  # None: 4
    medusa_train_lm_head: bool
    export_layout: str | None
    resume: bool
    force: bool  # --out may hold an exported head: it is replaced
    init_from: str | None
    refit_vocab: bool
    prompts: str | None
    no_builtin_prompts: bool
    magpie_share: float
    tokens: int
    draft_vocab_size: int
    block_size: int | None  # the block drafter's four (None: its defaults)
    draft_layers: int | None
    anchors: int | None
    loss_decay_gamma: float | None
    pack_rows: int | None  # None: one conversation a drafter forward
    eval_blocks: int | None  # None: the trainer's 10,000
    ttt_steps: int
    intermediate_size: int | None
    epochs: float
    max_steps: int | None
    hours: float | None
    batch_tokens: int
    lr: float | None
    eval_every: int
    checkpoint_every: int
    seed: int
    import_data: list[str] | None
    live_target: bool  # run the target on each batch even where the data engine could store its features
    data_only: bool
    gen_batch: int | None
    rows: int
    data_precision: str
    bf16: str
    export_dtype: str
    device: str
    threads: int | None
    revision: str | None


Options = CommandOptions | ReplayOptions | TrainDraftOptions

# command -> its options class (cli.COMMANDS names the function that takes it)
OPTIONS: dict[str, type] = {
    "run": RunOptions, "serve": ServeOptions, "generate": GenerateOptions, "bench": BenchOptions,
    "tune": TuneOptions, "export": ExportOptions, "replay": ReplayOptions, "train-draft": TrainDraftOptions,
}


class MissingFlag(AssertionError):
    """A field of an options class that the command's parser does not set: a bug in the parser, not the user's."""


def from_namespace(cls: type, args: argparse.Namespace) -> Any:
    """An instance of the options dataclass ``cls`` read from ``args``: each field by its name, a nested
    options dataclass from the same Namespace, ``knobs`` from the knob flags given.

    Raises MissingFlag when the parser set no value for a field: every field is the parser's to
    provide, so no default is ever guessed."""
    values = vars(args)
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out[f.name] = from_namespace(kind, args)
        elif f.name == "knobs":
            given = {name: _required(values, name, cls) for name in KNOB_FLAGS}
            out[f.name] = {name: value for name, value in given.items() if value is not None}
        else:
            out[f.name] = _required(values, f.name, cls)
    return cls(**out)


def _required(values: Mapping[str, Any], name: str, cls: type) -> Any:
    if name not in values:
        raise MissingFlag(f"{cls.__name__}.{name}: the parser sets no such value")
    return values[name]


def options_for(args: argparse.Namespace) -> Options:
    """The options object of the command ``args`` was parsed for."""
    return from_namespace(OPTIONS[args.command], args)


def flatten(options: Any) -> dict[str, Any]:
    """The parser's ``dest`` -> value for ``options`` (the inverse of :func:`from_namespace`; a knob not
    given is None)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if dataclasses.is_dataclass(value):
            out.update(flatten(value))
        elif f.name == "knobs":
            out.update({name: value.get(name) for name in KNOB_FLAGS})
        else:
            out[f.name] = value
    return out


def method_list(text: str | None) -> tuple[str, ...]:
    """``"medusa, eagle3"`` -> ``("medusa", "eagle3")`` (lower case); None -> ()."""
    return tuple(m for m in re.split(r"[\s,]+", text.lower()) if m) if text else ()
