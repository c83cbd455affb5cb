"""``--draft`` on the command line: generate and bench with EAGLE heads and standalone drafts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from heads import write_random_drafts, write_tiny_model

from specchat.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("cli-drafts")
    model = write_tiny_model(root / "model")
    return model, write_random_drafts(model, root / "drafts", draft_vocab=200)


def _generate(capsys, *args: str) -> dict:
    assert main(["generate", *args, "--prompt", "the world again", "--max-new-tokens", "20", "--json",
                 "--threads", "1"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["eagle", "eagle3", "standalone"])
def test_generate_infers_the_method_from_the_draft_and_matches_the_baseline(tiny, capsys, kind: str) -> None:
    model, drafts = tiny
    base = _generate(capsys, str(model), "--method", "none")
    out = _generate(capsys, str(model), "--draft", str(drafts[kind]))
    assert out["method"] == kind
    assert out["tokens"] == base["tokens"]


def test_sglang_alias_and_explicit_tree_flags(tiny, capsys) -> None:
    model, drafts = tiny
    base = _generate(capsys, str(model), "--method", "none")
    out = _generate(capsys, str(model), "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                    str(drafts["eagle3"]), "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                    "--speculative-num-draft-tokens", "6")
    assert out["method"] == "eagle3" and out["tokens"] == base["tokens"]


def test_bench_runs_every_draft_method_against_the_baseline(tiny, tmp_path: Path) -> None:
    model, drafts = tiny
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["the world", "again and again"]) + "\n")
    for kind in ("eagle", "eagle3", "standalone"):
        out = tmp_path / f"{kind}.json"
        assert main(["bench", str(model), "--draft", str(drafts[kind]), "--methods", f"none,ngram,{kind}",
                     "--prompts", str(prompts), "--max-new-tokens", "16", "--json", str(out), "--threads", "1"]) == 0
        rows = {r["method"]: r for r in json.loads(out.read_text())["results"]}
        assert set(rows) == {"none", "ngram", kind}
        assert all(r["identical_to_baseline"] for r in rows.values())
        # the cost split of each row's steps
        # (the baseline drafts nothing: its "draft" time is bookkeeping, which on a busy machine and
        # a tiny model can reach a third of its verify time, so the bound is loose)
        assert rows["none"]["mean_draft_levels"] == 0
        assert rows["none"]["draft_ms_per_step"] < rows["none"]["verify_ms_per_step"]
        assert rows[kind]["draft_ms_per_step"] > 0 and 0 <= rows[kind]["paused_share"] <= 1
        assert rows[kind]["mean_draft_levels"] > 0 and rows["ngram"]["mean_draft_levels"] == 0
        # default top-k 4: the budget measured trees and chains (n-gram has no width to choose)
        assert 0 <= rows[kind]["chain_share"] <= 1 and rows["ngram"]["chain_share"] is None
        # verified tokens a step: the root alone for the baseline, more where drafts went through
        assert rows["none"]["mean_tree_tokens"] == 1 and rows[kind]["mean_tree_tokens"] >= 1
        # whether drafting can pay here: never reckoned for the baseline; for a drafter, once measured
        assert rows["none"]["payoff"] is None
        assert rows[kind]["payoff"] is None or set(rows[kind]["payoff"]) == {"draft_share", "needed", "depth",
                                                                             "reached", "pays"}
        shapes = json.loads(out.read_text())["cost_shapes"]  # what the budget planned with
        assert len(shapes) == 1 and next(iter(shapes.values()))["1"] == 1


def _one_line_error(capsys, argv: list[str], *needles: str) -> None:
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("specchat: error:"), err
    for needle in needles:
        assert needle in err[0]


def test_bad_drafts_end_in_one_line(tiny, capsys, tmp_path: Path) -> None:
    model, drafts = tiny
    gen = ["generate", str(model), "--prompt", "hi", "--max-new-tokens", "4"]
    _one_line_error(capsys, [*gen, "--method", "eagle3"], "needs --draft")
    _one_line_error(capsys, [*gen, "--draft", str(tmp_path / "nope")], "no such file")
    _one_line_error(capsys, [*gen, "--method", "eagle", "--draft", str(drafts["eagle3"])], "--method eagle3")
    _one_line_error(capsys, [*gen, "--method", "eagle3", "--draft", str(drafts["standalone"])],
                    "full language model")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(str(drafts["eagle"] / "model.safetensors")), pickled / "pytorch_model.bin")
    (pickled / "config.json").write_text((drafts["eagle"] / "config.json").read_text())
    _one_line_error(capsys, [*gen, "--draft", str(pickled)], "--allow-pickle")
    assert main([*gen, "--draft", str(pickled), "--allow-pickle", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["method"] == "eagle"


def test_bench_times_the_draft_training_paths(tiny, tmp_path: Path, monkeypatch) -> None:
    """--data-engine: the one-row generator against the rows engine; --train-speed: the target
    run per batch against stored features (a tiny model: the machinery, not the numbers)."""
    import specchat.bench_train as bench_train

    model, _ = tiny
    out = tmp_path / "data.json"
    assert main(["bench", str(model), "--data-engine", "40", "--rows", "4", "--threads", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["rows"] for r in rows[:2]] == [1, 4]
    assert all(r["answer_tokens"] >= 40 and r["answer_tokens_per_s"] > 0 for r in rows)
    monkeypatch.setattr(bench_train, "TRAIN_BENCH_TOKENS", 300)
    out = tmp_path / "train.json"
    assert main(["bench", str(model), "--train-speed", "--rows", "4", "--threads", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [r["bf16"] for r in rows] == [False, False, True] and all(r["answer_tokens_per_s"] > 0 for r in rows)


def test_bench_and_generate_take_a_precision(tiny, tmp_path: Path, capsys) -> None:
    from engine.kernels import native

    model, _ = tiny
    _one_line_error(capsys, ["generate", str(model), "--prompt", "hi", "--precision", "fp8"], "--precision")
    kernel = native.load()
    if kernel is None or kernel.fast_variant is None:
        _one_line_error(capsys, ["generate", str(model), "--prompt", "hi", "--precision", "fast"],
                        "use --precision exact")
        return
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "again and again and again"}) + "\n")
    out = tmp_path / "b.json"
    assert main(["bench", str(model), "--methods", "none,ngram", "--precision", "exact,fast", "--prompts",
                 str(prompts), "--max-new-tokens", "12", "--json", str(out), "--threads", "1"]) == 0
    rows = json.loads(out.read_text())["results"]
    assert {(r["method"], r["precision"]) for r in rows} == {(m, p) for m in ("none", "ngram")
                                                             for p in ("exact", "fast")}
    assert all(r["identical_to_baseline"] for r in rows)
    assert all(0 < r["prefill_ms_per_prompt"] < 1e3 * r["seconds"] for r in rows)  # the precisions' prefill apart
    _one_line_error(capsys, ["bench", str(model), "--precision", "fast", "--weights", "fp32", "--prompts",
                             str(prompts)], "stored weights only")


def test_bench_creates_the_json_folder(tiny, tmp_path: Path) -> None:
    """--json bench-out/x.json on a fresh machine: the folder is made, not a FileNotFoundError at
    the end of the run; CPU runs report no CUDA graph counts (they have no graphs)."""
    model, _ = tiny
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "again and again"}) + "\n")
    out = tmp_path / "bench-out" / "deeper" / "x.json"
    assert main(["bench", str(model), "--methods", "none,ngram", "--prompts", str(prompts), "--max-new-tokens", "8",
                 "--json", str(out), "--threads", "1"]) == 0
    report = json.loads(out.read_text())
    assert {r["method"] for r in report["results"]} == {"none", "ngram"} and "cuda_graphs" not in report


@pytest.mark.parametrize("mode", [["--prompts", "PROMPTS"], ["--cost-curve"], ["--data-engine", "8"]])
def test_bench_refuses_an_unwritable_json_before_loading(tiny, tmp_path: Path, monkeypatch, capsys,
                                                         mode: list[str]) -> None:
    import engine.loader

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before --json was checked")

    monkeypatch.setattr(engine.loader, "load_session", no_load)
    model, _ = tiny
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "again"}) + "\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    flags = [str(prompts) if f == "PROMPTS" else f for f in mode]
    _one_line_error(capsys, ["bench", str(model), *flags, "--json", str(blocker / "out" / "x.json")],
                    f"{blocker} is a file, not a folder")
