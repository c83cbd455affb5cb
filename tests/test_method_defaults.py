"""Per-method knob defaults (a registration's ``defaults``): one rule for what a knob the user did not set
becomes (SpecConfig.for_method), applied on every way in and on every method switch.

The promises: a registration's defaults name only knobs it reads, within their bounds (an agreement
test, and a bad one refused); a knob left unset takes the chosen method's default, a flag or a settings
file's field wins over it; a switch of method (SpecConfig.with_method) keeps the knobs the user set and
gives the others the new method's defaults, landing where a launch with the same flags would; the
loader's method read from a draft, bench's rows, tune's points and export's lines all resolve so; the
docs' table of them is the registry's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import methods
from engine.config import ConfigError, SpecConfig, drafting_knobs, method_defaults
from engine.knobs import KNOBS
from engine.method_spec import MethodSpec
from specchat.options import draft_options, given_knobs, make_config
from tests.parsed import parsed

ROOT = Path(__file__).resolve().parents[1]
NAMES = methods.names()


# -- the registrations ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_each_registrations_defaults_are_knobs_it_reads_within_their_bounds(name: str) -> None:
    spec = methods.get(name)
    assert set(spec.defaults) <= set(spec.knobs), name
    for knob, value in spec.defaults.items():
        KNOBS[knob].check(value)  # raises ConfigError outside the knob's bounds
    config = SpecConfig.for_method(name)  # and together they make a valid config
    assert {k: getattr(config, k) for k in spec.defaults} == method_defaults(name) == dict(spec.defaults)


def test_dflash_defaults_to_sglangs_chain_of_a_block_of_16() -> None:
    """SGLang's DFLASH pins top-k to 1; its unset tree size is the drafter's block (16 without one)."""
    config = SpecConfig.for_method("dflash")
    assert (config.eagle_topk, config.num_draft_tokens) == (1, 16)
    for tree in methods.tree_methods():  # the tree methods keep engine/knobs.py's (SGLang's Llama values)
        config = SpecConfig.for_method(tree)
        assert (config.num_steps, config.eagle_topk, config.num_draft_tokens) == (5, 4, 8)


@pytest.mark.parametrize(("defaults", "message"), [
    ({"eagle_topk": 2}, r"declares a default for 'eagle_topk', a knob it does not read \(num_draft_tokens\)"),
    ({"num_draft_tokens": 99}, r"'odd''s default: num_draft_tokens must be an integer from 2 to 64"),
    ({"num_draft_tokens": "8"}, r"num_draft_tokens must be an integer"),
])
def test_a_registration_with_a_bad_default_is_refused_when_it_is_resolved(defaults, message) -> None:
    with methods.registered(MethodSpec("odd", knobs=("num_draft_tokens",), defaults=defaults)), \
            pytest.raises(ValueError, match=message):
        SpecConfig.for_method("odd")


# -- resolution from the flags ----------------------------------------------------------------------------
def test_a_knob_left_unset_takes_the_methods_default_and_a_flag_wins() -> None:
    unset = make_config(parsed("run", "--method", "dflash").spec, method="ngram")
    assert (unset.method, unset.eagle_topk, unset.num_draft_tokens) == ("dflash", 1, 16)
    wide = make_config(parsed("run", "--method", "dflash", "--speculative-eagle-topk", "4").spec, method="ngram")
    assert (wide.eagle_topk, wide.num_draft_tokens) == (4, 16)  # the flag wins; the other knob is still dflash's
    tree = make_config(parsed("generate", "--prompt", "hi", "--method", "eagle3").spec, method="ngram")
    assert (tree.eagle_topk, tree.num_draft_tokens) == (4, 8)


def test_a_settings_files_field_wins_over_the_methods_default_and_a_flag_over_both(tmp_path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"method": "dflash", "eagle_topk": 3}))
    saved = make_config(parsed("run", "--settings", str(path)).spec, method="ngram")
    assert (saved.eagle_topk, saved.num_draft_tokens) == (3, 16)
    flagged = parsed("run", "--settings", str(path), "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens",
                     "9")
    assert (make_config(flagged.spec).eagle_topk, make_config(flagged.spec).num_draft_tokens) == (2, 9)
    assert set(given_knobs(flagged.spec)) == {"method", "eagle_topk", "num_draft_tokens"}


def test_a_commands_own_defaults_sit_under_the_methods() -> None:
    """generate's answer length is the command's; the method's knobs are still the method's."""
    config = make_config(parsed("generate", "--prompt", "hi", "--method", "dflash").spec, method="ngram",
                         max_new_tokens=256)
    assert (config.max_new_tokens, config.eagle_topk) == (256, 1)


# -- a switch of method ------------------------------------------------------------------------------------
def test_a_switch_keeps_the_knobs_set_and_resets_the_untouched() -> None:
    start = make_config(parsed("run", "--method", "eagle3", "--speculative-num-steps", "3",
                               "--temperature", "0.5").spec)
    kept = given_knobs(parsed("run", "--method", "eagle3", "--speculative-num-steps", "3", "--temperature",
                              "0.5").spec)
    block = start.with_method("dflash", kept)
    assert (block.eagle_topk, block.num_draft_tokens, block.num_steps, block.temperature) == (1, 16, 3, 0.5)
    back = block.with_method("eagle3", kept)
    assert back == start  # the chain dflash brought is gone again: eagle3's own top-k and tree size
    widened = block.replace(eagle_topk=2).with_method("eagle3", {*kept, "eagle_topk"})
    assert (widened.eagle_topk, widened.num_draft_tokens) == (2, 8)  # set on dflash, kept on eagle3


def test_a_switch_leaves_what_no_method_reads() -> None:
    """Sampling, the answer length, the budget: no method's default, so a switch never moves them."""
    config = SpecConfig.for_method("ngram", base={"max_new_tokens": 256, "adaptive_draft": False, "seed": 3})
    switched = config.with_method("dflash")
    assert (switched.max_new_tokens, switched.adaptive_draft, switched.seed) == (256, False, 3)
    assert not {"max_new_tokens", "adaptive_draft", "seed", "temperature"} & drafting_knobs()


def test_a_kept_value_the_new_method_cannot_take_is_refused_in_one_line() -> None:
    small = SpecConfig.for_method("dflash", {"num_draft_tokens": 3})
    with pytest.raises(ConfigError, match="eagle_topk=4 is more than the tree holds: num_draft_tokens=3"):
        small.with_method("eagle3", {"num_draft_tokens"})


def test_sglangs_chain_rule_follows_the_switch() -> None:
    """A top-k of 1 the user gave, and no tree size: a tree method's chain of num_steps + 1, whichever
    method the session switches to."""
    chain = SpecConfig.for_method("eagle3", {"eagle_topk": 1, "num_steps": 4})
    assert chain.num_draft_tokens == methods.chain_size(4)
    block = chain.with_method("dflash", {"eagle_topk", "num_steps"})
    assert block.num_draft_tokens == 16
    assert block.with_method("medusa", {"eagle_topk", "num_steps"}).num_draft_tokens == methods.chain_size(4)


SET = st.fixed_dictionaries({}, optional={
    "num_steps": st.integers(1, 6), "eagle_topk": st.integers(1, 4), "num_draft_tokens": st.integers(5, 16),
    "ngram_max_bfs_breadth": st.integers(1, 10), "medusa_tree": st.sampled_from(["dynamic", "static"]),
    "temperature": st.sampled_from([0.0, 0.7]), "max_new_tokens": st.integers(1, 300),
})


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(NAMES), st.sampled_from(NAMES), SET)
def test_a_switch_lands_where_a_launch_with_the_same_settings_would(a: str, b: str, chosen: dict) -> None:
    """Whatever the two methods and the settings the user gave: switching from A to B is starting on B
    with the same settings (so a hot swap and a bench row agree with a fresh launch), and back again is A."""
    on_a = SpecConfig.for_method(a, chosen)
    assert on_a.with_method(b, chosen) == SpecConfig.for_method(b, chosen)
    assert on_a.with_method(b, chosen).with_method(a, chosen) == on_a
    assert all(getattr(on_a.with_method(b, chosen), k) == v for k, v in chosen.items())  # what was set, kept


# -- the surfaces --------------------------------------------------------------------------------------
def test_the_method_read_from_a_draft_brings_its_defaults(tmp_path, monkeypatch) -> None:
    """``run --draft DFLASH_DRAFTER`` (no --method): the loader reads dflash from the drafter and gives the
    knobs the user left unset dflash's defaults; a flag the user gave is kept."""
    import engine.loader
    from engine.loader import LoadedModel, load_session
    from tests.test_dflash import drafter_dir, target
    from tests.tiny import TinyTokenizer

    monkeypatch.setenv("SPECCHAT_CALIBRATE", "0")
    monkeypatch.setattr(engine.loader, "load_model",
                        lambda *a, **k: LoadedModel(target(), TinyTokenizer(97), "tiny", "", "specchat"))
    for flags, want in (((), (1, 16)), (("--speculative-eagle-topk", "3"), (3, 16))):
        options = parsed("run", "tiny", "--draft", str(drafter_dir()), *flags)
        drafts = {k: v for k, v in draft_options(options).items() if k != "also"}
        session = load_session("tiny", make_config(options.spec, method="ngram"), **drafts)
        assert session.config.method == "dflash"
        assert (session.config.eagle_topk, session.config.num_draft_tokens) == want, flags


def test_bench_gives_each_row_its_methods_defaults_unless_a_flag_is_given(tmp_path) -> None:
    from specchat.bench import plan_bench

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')

    def rows(*flags: str) -> dict[str, SpecConfig]:
        options = parsed("bench", "--prompts", str(prompts), "--methods", "none,eagle3,dflash", *flags)
        return plan_bench(options, make_config(options.spec, method="none", max_new_tokens=256), ["stored"]).configs

    plain = rows()
    assert (plain["eagle3"].eagle_topk, plain["dflash"].eagle_topk, plain["dflash"].num_draft_tokens) == (4, 1, 16)
    assert plain["dflash"].max_new_tokens == 256
    wide = rows("--speculative-eagle-topk", "2")
    assert (wide["eagle3"].eagle_topk, wide["dflash"].eagle_topk, wide["dflash"].num_draft_tokens) == (2, 2, 16)


def test_tune_runs_each_method_with_its_defaults_for_the_knobs_its_grid_leaves_out() -> None:
    from specchat.tune import Search, method_axes

    base = SpecConfig.for_method("none", base={"max_new_tokens": 256})
    narrowed = Search.build("dflash", {"num_draft_tokens": [8, 16]}, base)
    assert {(s.config.eagle_topk, s.config.num_draft_tokens) for s in narrowed.points.values()} == {(1, 8), (1, 16)}
    assert all(s.config.max_new_tokens == 256 and not s.config.adaptive_draft for s in narrowed.points.values())
    flagged = Search.build("dflash", method_axes("dflash", {}, {"eagle_topk"}), base.replace(eagle_topk=3),
                           {"eagle_topk"})  # --speculative-eagle-topk 3: held, not swept
    assert {s.config.eagle_topk for s in flagged.points.values()} == {3}


def test_a_compare_runs_each_method_as_a_switch_to_it_would() -> None:
    """``--compare dflash,eagle3`` from a session on ngram: each pane its method's defaults, what the user
    set kept (the job carries it: specchat/tui/host_api.py CompareJob.given)."""
    from specchat.tui.host import compare_runs

    config = SpecConfig.for_method("ngram", {"num_steps": 3})
    runs = dict(compare_runs(config, ("dflash", "eagle3"), {"num_steps"}))
    assert (runs["alt"].eagle_topk, runs["alt"].num_draft_tokens) == (1, 16)
    assert (runs["spec"].eagle_topk, runs["spec"].num_steps) == (4, 3)
    assert runs["baseline"].method == "none"


def test_export_writes_the_methods_defaults_the_flags_leave_unset() -> None:
    """z-lab's SGLang line for a b16 drafter says 16, its vLLM line 15 speculative tokens."""
    from specchat.export import launch_line

    config = make_config(parsed("export", "sglang", "--method", "dflash", "--draft", "d").spec, method="ngram")
    sglang = launch_line("sglang", config, None, "d")
    assert "--speculative-num-draft-tokens 16" in sglang.command and not any("DDTree" in n for n in sglang.notes)
    assert '"num_speculative_tokens": 15' in launch_line("vllm", config, None, "d").command
    assert "--spec-draft-n-max 15" in launch_line("llamacpp", config, None, "d").command


def test_each_flags_help_names_the_methods_own_defaults() -> None:
    import argparse

    from specchat.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub.choices["run"]._actions}
    for name in ("eagle_topk", "num_draft_tokens"):
        assert helps[name].endswith(f"default {KNOBS[name].default}; dflash: {method_defaults('dflash')[name]})")
    assert "dflash" not in helps["num_steps"]


def test_the_docs_table_of_method_defaults_is_the_registrys() -> None:
    """docs/methods.md lists each method's own defaults; a registration that adds one updates it."""
    text = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    table = text[text.index("| method | its own defaults"):]
    table = table[:table.index("\n\n")]
    documented = {}
    for row in table.splitlines()[2:]:
        method, defaults = row.split("|")[1:3]
        documented[method.strip(" `")] = {k: int(v) for k, v in re.findall(r"`(\w+)` (\d+)", defaults)}
    assert documented == {m.name: dict(m.defaults) for m in methods.all_methods() if m.defaults}
