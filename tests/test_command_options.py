"""specchat/command_options.py: each command's typed options, built once from the parsed flags.

The promises: every subcommand's parser provides every field its options class declares (so no
``getattr`` default is ever needed past the parser), and every flag it parses reaches a field (none
is parsed and then dropped); a field the parser lacks fails loudly; the options are frozen, so a
command cannot leave a value behind for another to read.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from specchat.cli import COMMANDS, build_parser
from specchat.command_options import (
    KNOB_FLAGS,
    OPTIONS,
    MissingFlag,
    RunOptions,
    flatten,
    from_namespace,
    options_for,
)

# the least each subcommand parses
MINIMAL: dict[str, list[str]] = {
    "run": [], "serve": [], "generate": ["--prompt", "hi"], "bench": [], "tune": ["--prompts", "p.jsonl"],
    "export": ["sglang"], "replay": ["trace.jsonl"], "train-draft": [],
}


def test_every_command_has_an_options_class() -> None:
    assert set(OPTIONS) == set(COMMANDS) == set(MINIMAL)


@pytest.mark.parametrize("command", sorted(MINIMAL))
def test_the_parser_provides_every_field_and_every_flag_reaches_one(command: str) -> None:
    args = build_parser().parse_args([command, *MINIMAL[command]])
    options = options_for(args)  # raises MissingFlag for a field the parser does not set
    assert isinstance(options, OPTIONS[command])
    assert set(flatten(options)) == set(vars(args)) - {"command"}  # nothing parsed is dropped


def test_the_options_hold_the_parsed_values() -> None:
    options = options_for(build_parser().parse_args(
        ["run", "my/model", "--threads", "2", "--draft", "my/head", "--speculative-num-steps", "4", "--teach"]))
    assert (options.target.model, options.target.threads, options.target.dtype) == ("my/model", 2, "auto")
    assert (options.spec.draft, options.spec.knobs, options.teach) == ("my/head", {"num_steps": 4}, True)
    assert options.spec.knob("method") is None  # a knob not given is absent, not its default


def test_flatten_gives_back_the_namespace() -> None:
    args = build_parser().parse_args(["bench", "m", "--methods", "none,eagle3", "--top-k", "5", "--cost-curve"])
    flat = flatten(options_for(args))
    assert flat == {k: v for k, v in vars(args).items() if k != "command"}
    assert set(KNOB_FLAGS) <= set(flat)


def test_a_field_the_parser_lacks_fails_loudly() -> None:
    args = build_parser().parse_args(["run"])
    del args.teach
    with pytest.raises(MissingFlag, match=r"RunOptions\.teach"):
        from_namespace(RunOptions, args)
    knobless = argparse.Namespace(**{k: v for k, v in vars(build_parser().parse_args(["run"])).items()
                                     if k != "num_steps"})
    with pytest.raises(MissingFlag, match=r"SpecOptions\.num_steps"):
        from_namespace(RunOptions, knobless)


def test_options_are_frozen() -> None:
    options = options_for(build_parser().parse_args(["run"]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.target.precision = "fast"  # type: ignore[misc]
