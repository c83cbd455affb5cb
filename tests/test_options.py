"""specchat/options.py: one mapping from flags to a SpecConfig, for every command and the TUI.

The promises: ``specchat run`` (the TUI) builds the SpecConfig ``generate`` builds for the same
flags (SGLang's top-k 1 rule and a draft implying the method included); every command takes the
mapping and the user-error type from options, never from the dispatcher (no import circle); a
user's mistake is recognised by its class (``UserError``), a missing file they named included.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from engine.errors import MissingFileError, UserError
from specchat.cli import build_parser, main
from specchat.generate import generate_config
from specchat.options import UsageError, draft_options, make_config
from specchat.tui.launch import config_from_args
from tests.parsed import parsed

ROOT = Path(__file__).resolve().parents[1]

FLAG_SETS = [
    [],
    ["--method", "eagle3", "--speculative-eagle-topk", "1"],  # SGLang: a chain of num_steps + 1 tokens
    ["--speculative-algorithm", "EAGLE2", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"],
    ["--method", "standalone", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"],
    ["--speculative-draft-model-path", "some/head"],  # the loader infers the method from the draft
    ["--method", "ngram", "--speculative-ngram-match-type", "prob", "--temperature", "0.5", "--seed", "3"],
    ["--no-adaptive-draft", "--top-k", "20", "--top-p", "0.9", "--sampling", "rejection"],
]


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: " ".join(f) or "defaults")
def test_the_tui_and_generate_build_the_same_config(flags: list[str]) -> None:
    run = parsed("run", *flags, "--max-new-tokens", "64")
    gen = parsed("generate", "--prompt", "hi", *flags, "--max-new-tokens", "64")
    assert config_from_args(run) == generate_config(gen)
    assert draft_options(run) == draft_options(gen)


def test_sglang_rules_apply_to_the_tui() -> None:
    chain = config_from_args(parsed("run", "--method", "eagle3", "--speculative-eagle-topk", "1",
                                    "--speculative-num-steps", "4"))
    assert (chain.eagle_topk, chain.num_steps, chain.num_draft_tokens) == (1, 4, 5)
    drafted = parsed("run", "--speculative-draft-model-path", "some/head")
    assert config_from_args(drafted).method == "none"  # until load_session reads the draft
    assert draft_options(drafted)["method_from_draft"] is True
    assert config_from_args(parsed("run")).method == "ngram"


def test_bench_never_lets_the_draft_pick_the_method() -> None:
    options = parsed("bench", "--draft", "some/head", "--prompts", "p.jsonl")
    assert draft_options(options)["method_from_draft"] is False
    assert make_config(options.spec, method="none").method == "none"


def test_unknown_method_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown method 'lookahead'; choose none, ngram"):  # as it is parsed
        build_parser().parse_args(["generate", "--prompt", "hi", "--method", "lookahead"])
    spec = dataclasses.replace(parsed("generate", "--prompt", "hi").spec, knobs={"method": "lookahead"})
    with pytest.raises(UsageError, match="unknown method"):  # options built by other means
        make_config(spec, method="ngram")
    assert issubclass(UsageError, UserError)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_only_the_entry_point_imports_the_dispatcher() -> None:
    importers = sorted(str(p.relative_to(ROOT)) for package in ("engine", "specchat")
                       for p in (ROOT / package).rglob("*.py") if "specchat.cli" in _imports(p))
    assert importers == ["specchat/__main__.py"]


def test_user_errors_are_known_by_class_not_by_name(capsys, monkeypatch) -> None:
    """A UserError of any module prints as one line; any other exception is our bug and surfaces."""
    import specchat.generate

    def fail(exc: Exception):
        def run(_args):
            raise exc
        return run

    monkeypatch.setattr(specchat.generate, "run_generate", fail(MissingFileError("x.txt: no such file")))
    assert main(["generate", "--prompt", "hi"]) == 2
    assert capsys.readouterr().err == "specchat: error: x.txt: no such file\n"
    monkeypatch.setattr(specchat.generate, "run_generate", fail(FileNotFoundError("our bug")))
    with pytest.raises(FileNotFoundError):
        main(["generate", "--prompt", "hi"])


def _one_line(capsys, argv: list[str], *needles: str) -> None:
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("specchat: error:"), err
    for needle in needles:
        assert needle in err[0]


def test_missing_files_the_user_named_are_one_line(tmp_path: Path, capsys) -> None:
    nope = tmp_path / "nope"
    _one_line(capsys, ["generate", "--prompt-file", str(nope)], str(nope))
    _one_line(capsys, ["bench", "--prompts", str(nope)], str(nope))
    _one_line(capsys, ["train-draft", "--out", str(tmp_path / "out"), "--init-from", str(nope)], "--init-from")
    _one_line(capsys, ["train-draft", "--out", str(tmp_path / "out"), "--prompts", str(nope)], str(nope))
    _one_line(capsys, ["train-draft", "--out", str(tmp_path / "out"), "--import-data", str(nope)], "--import-data")
    _one_line(capsys, ["train-draft", "--out", str(tmp_path / "out"), "--magpie-share", "1.5"], "--magpie-share")
    _one_line(capsys, ["train-draft", "--out", str(tmp_path / "out"), "--refit-vocab"], "--refit-vocab", "--init-from")
    _one_line(capsys, ["train-draft", "--out", str(tmp_path / "out"), "--magpie-share", "0", "--no-builtin-prompts"],
              "--prompts")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"turns": [3]}) + "\n")
    _one_line(capsys, ["train-draft", "--out", str(tmp_path / "out"), "--prompts", str(bad)], "bad.jsonl:2")
