"""Every knob declared once (engine/knobs.py): its bounds hold everywhere, and every surface that
shows or takes it (SpecConfig, the CLI, the TUI's settings schema, export) agrees with it."""

from __future__ import annotations

import argparse
import math

import pytest
from tiny import TinyTokenizer, our_model

from engine.config import ConfigError, SpecConfig
from engine.drafters.base import NoDrafter
from engine.drafters.standalone import StandaloneDrafter
from engine.knobs import KNOBS, Knob
from engine.session import Session

# per knob: values just past each bound, and absurd ones (what the issue tried)
OUT_OF_BOUNDS: dict[str, list[object]] = {
    "num_steps": [0, 33, 99999],
    "eagle_topk": [0, 65, 99999],
    "num_draft_tokens": [1, 65, 10**9],
    "ngram_min_match_window_size": [0, 65],
    "ngram_max_match_window_size": [0, 65],
    "ngram_min_bfs_breadth": [0, 65],
    "ngram_max_bfs_breadth": [0, 65],
    "ngram_max_trie_depth": [1, 129],
    "ngram_capacity": [999, 10_000_001],
    "temperature": [-0.1, 10.5, math.nan, math.inf],
    "top_p": [0.0, 1.01, math.nan],
    "top_k": [-1, 262_145],
    "seed": [-1, 2**63],
    "max_new_tokens": [0, -5, 10**12],
    "method": ["magic"],
    "ngram_match_type": ["DFS"],
    "ngram_mode": ["web"],
    "medusa_tree": ["fixed"],
    "sampling": ["greedy"],
    "context_overflow": ["truncate"],
    "adaptive_draft": [1, "yes"],
    "ngram_corpus": [0],
}


def test_every_knob_has_out_of_bounds_cases() -> None:
    assert set(OUT_OF_BOUNDS) == set(KNOBS)


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, vs in OUT_OF_BOUNDS.items() for v in vs])
def test_spec_config_refuses_every_out_of_bounds_value_in_one_line(name: str, value: object) -> None:
    with pytest.raises(ConfigError) as err:
        SpecConfig(**{name: value})
    message = str(err.value)
    assert "\n" not in message and name in message
    knob = KNOBS[name]
    if knob.flag and name != "method":
        assert knob.flag in message  # the flag to change
    if knob.low is not None and knob.high is not None:
        assert knob.describe() in message  # the allowed range


@pytest.mark.parametrize("knob", KNOBS.values(), ids=list(KNOBS))
def test_each_bound_itself_is_allowed(knob: Knob) -> None:
    """The bounds are inclusive (top_p's low end excepted): the largest setting a user may pick runs."""
    for edge in (knob.low, knob.high):
        if edge is None or (edge == knob.low and knob.low_open):
            continue
        value = knob.kind(edge)
        extra = {"num_draft_tokens": 64} if knob.name in ("eagle_topk",) else {}
        if knob.name.startswith("ngram_max_match"):
            extra = {"ngram_max_trie_depth": int(edge) + 1}
        if knob.name == "ngram_max_trie_depth" and edge == knob.low:
            extra = {"ngram_max_match_window_size": 1}
        if knob.name.startswith("ngram_min_"):
            extra = {knob.name.replace("min", "max"): value}
            if "window" in knob.name:
                extra["ngram_max_trie_depth"] = value + 1
        assert getattr(SpecConfig(**{knob.name: value}, **extra), knob.name) == value


def test_spec_config_takes_its_fields_and_defaults_from_the_knobs() -> None:
    import dataclasses

    fields = {f.name: f.default for f in dataclasses.fields(SpecConfig)}
    assert fields == {k.name: k.default for k in KNOBS.values()}


def test_every_knob_says_why_its_bounds_where_it_has_an_upper_one() -> None:
    for knob in KNOBS.values():
        if knob.high is not None and knob.name not in ("temperature", "top_p"):
            assert knob.why, knob.name
        if knob.flag is None:
            assert knob.why, f"{knob.name}: say why it has no flag"


# -- the session: max_new_tokens against the model's context, a cancel before each level ----------
def test_max_new_tokens_beyond_the_context_is_refused_with_the_context_size_and_a_hot_swap_keeps_the_old() -> None:
    target = our_model("llama", 0)[0]  # context 512
    with pytest.raises(ConfigError, match=r"max_new_tokens=100000 .*context of 512 tokens.*--max-new-tokens 512"):
        Session(target, TinyTokenizer(), SpecConfig(max_new_tokens=100_000), drafters={"none": NoDrafter})
    s = Session(target, TinyTokenizer(), SpecConfig(max_new_tokens=512), drafters={"none": NoDrafter})
    with pytest.raises(ConfigError, match="context of 512"):
        s.update_config(s.config.replace(max_new_tokens=513))
    assert s.config.max_new_tokens == 512 and s.pending_config is None


def test_a_cancel_is_seen_before_each_drafting_level_at_the_largest_settings(monkeypatch) -> None:
    """Esc at 32 levels a step: the drafter looks for the cancel before each level, so the step in
    flight ends after the level that was running (not after 31 more forwards)."""
    target, draft = our_model("llama", 0)[0], our_model("llama", 1, num_hidden_layers=1)[0]
    config = SpecConfig(method="standalone", num_steps=32, eagle_topk=8, num_draft_tokens=64, max_new_tokens=500,
                        adaptive_draft=False)
    s = Session(target, TinyTokenizer(stop_ids=frozenset()), config,
                drafters={"none": NoDrafter, "standalone": lambda: StandaloneDrafter(draft, 97)})
    calls: list[int] = []
    forward = draft.forward

    def counted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the root's forward, level 2, and during level 3 the user presses Esc
            s.cancel()
        return forward(*args, **kwargs)

    monkeypatch.setattr(draft, "forward", counted)
    events = list(s.generate_ids([1, 5, 9]))
    assert events[-1].reason == "cancelled"
    assert len(calls) == 3


# -- the surfaces agree with the declaration --------------------------------------------------------
def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from specchat.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: sub.choices[name] for name in ("run", "serve", "generate", "bench", "tune", "export")}


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(a for a in parser._actions if flag in a.option_strings)


@pytest.mark.parametrize("knob", [k for k in KNOBS.values() if k.flag], ids=lambda k: k.name)
def test_every_knob_is_a_flag_of_every_command_with_its_sglang_name_and_help(knob: Knob) -> None:
    for command, parser in _subparsers().items():
        action = _action(parser, knob.flag)
        assert action.dest == knob.name, command
        assert action.help.startswith(knob.help), command
        if knob.sglang:
            assert knob.sglang in action.option_strings, f"{command}: SGLang's name {knob.sglang}"
        if knob.kind is not bool and knob.default is not None:  # the flag takes the default, in any case
            assert action.type(str(knob.default).lower()) == knob.default, command


def test_the_settings_schema_is_the_knobs_with_a_label() -> None:
    from specchat.tui.settings_schema import ENGINE_FIELDS, FIELDS

    assert [f.name for f in ENGINE_FIELDS] == [k.name for k in KNOBS.values() if k.label]
    for knob in KNOBS.values():
        if knob.label:
            field = FIELDS[knob.name]
            assert (field.label, field.help, field.choices) == (knob.label, knob.help, knob.choices)


def test_exports_sglang_line_names_each_knob_by_its_sglang_flag() -> None:
    from engine import methods
    from engine.config import METHOD_KNOBS
    from engine.knobs import SGLANG_ALGORITHMS
    from specchat.export import SGLANG_REMOVED, sglang_line

    for method in SGLANG_ALGORITHMS:
        config = SpecConfig(method=method)
        command = sglang_line(config, None, "d").command
        assert f"--speculative-algorithm {SGLANG_ALGORITHMS[method]}" in command
        taken = methods.get(method).sglang_knobs  # None: every knob it reads (a block's width is ours)
        for name in METHOD_KNOBS[method]:
            flag = KNOBS[name].sglang
            if flag and flag not in SGLANG_REMOVED:
                assert (f"{flag} {getattr(config, name)}" in command) == (taken is None or name in taken), \
                    (method, name)
        known = {k.sglang for k in KNOBS.values()} | {"--model-path", "--speculative-draft-model-path"}
        assert {w for w in command.split() if w.startswith("--")} <= known


# -- the CLI: one line, exit 2, before any work ------------------------------------------------------
CLI_CASES = [(KNOBS[n].flag, str(v)) for n, vs in OUT_OF_BOUNDS.items() for v in vs
             if KNOBS[n].flag and KNOBS[n].kind is not bool]


@pytest.mark.parametrize(("flag", "value"), CLI_CASES)
def test_the_cli_refuses_each_out_of_bounds_knob_in_one_line(flag: str, value: str, capsys) -> None:
    """``export`` for speed (it loads no model); every command shares the parser's flags."""
    from specchat.cli import main

    assert main(["export", "sglang", flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specchat: error: argument ") and flag in err[0], err
    assert "must be" in err[0] or "choose" in err[0]


OTHER_FLAGS = [
    (["generate", "--prompt", "hi", "--threads", "0"], "--threads", "from 1 to"),
    (["generate", "--prompt", "hi", "--threads", "-3"], "--threads", "from 1 to"),
    (["run", "--threads", "100000"], "--threads", "from 1 to"),
    (["replay", "t.jsonl", "--speed", "0"], "--speed", "above 0"),
    (["replay", "t.jsonl", "--speed", "nan"], "--speed", "above 0"),
    (["replay", "t.jsonl", "--speed", "inf"], "--speed", "above 0"),
    (["train-draft", "--out", "x", "--max-steps", "-5"], "--max-steps", "from 1 to"),
    (["train-draft", "--out", "x", "--max-steps", "0"], "--max-steps", "from 1 to"),
    (["train-draft", "--out", "x", "--epochs", "0"], "--epochs", "above 0"),
    (["train-draft", "--out", "x", "--threads", "0"], "--threads", "from 1 to"),
    (["bench", "--limit", "0"], "--limit", "from 1 to"),
    (["bench", "--rows", "-1"], "--rows", "from 1 to"),
    (["bench", "--context", "0"], "--context", "from 1 to"),
    (["tune", "--prompts", "p.jsonl", "--minutes", "0"], "--minutes", "above 0"),
    (["tune", "--prompts", "p.jsonl", "--minutes", "nan"], "--minutes", "above 0"),
    (["tune", "--prompts", "p.jsonl", "--limit", "-2"], "--limit", "from 1 to"),
    (["serve", "--port", "0"], "--port", "from 1 to 65535"),
    (["serve", "--port", "70000"], "--port", "from 1 to 65535"),
    (["serve", "--max-sessions", "0"], "--max-sessions", "from 1 to"),
    (["generate", "--prompt", "hi", "--speculative-num-steps", "abc"], "--speculative-num-steps", "an integer"),
]


@pytest.mark.parametrize(("argv", "flag", "needle"), OTHER_FLAGS, ids=lambda x: " ".join(x) if isinstance(x, list)
                         else None)
def test_every_numeric_flag_is_refused_in_one_line_before_any_work(argv: list[str], flag: str, needle: str,
                                                                   capsys) -> None:
    from specchat.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and needle in err[0], err


def test_a_settings_file_out_of_bounds_is_refused_in_one_line(tmp_path, capsys) -> None:
    from specchat.cli import main

    settings = tmp_path / "s.json"
    settings.write_text('{"method": "eagle3", "num_steps": 99999}')
    assert main(["export", "sglang", "--settings", str(settings)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_steps must be an integer from 1 to 32" in err[0], err
