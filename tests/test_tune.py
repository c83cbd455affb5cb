"""``specchat tune``: the grid parser, the sweep on a tiny random model, the budget, the outputs.

The promises: a bad --grid is refused in one line before anything loads; the sweep runs every
setting of the grid beside the baseline with the adaptive budget off, skips what the config
refuses, checks every answer against the baseline (and says so loudly when one differs); a
--minutes budget stops it between batches (a fake clock here: no timed tests); --json holds
everything and --save-settings writes what ``specchat run --settings`` reads back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from heads import write_random_drafts, write_tiny_model

import specchat.tune as tune
from engine.config import SpecConfig
from engine.errors import UserError
from specchat.cli import build_parser, main
from specchat.command_options import options_for
from specchat.options import load_settings
from specchat.tui.launch import config_from_args
from specchat.tune import Search, parse_grid


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path], Path]:
    root = tmp_path_factory.mktemp("tune")
    model = write_tiny_model(root / "model")
    prompts = root / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "prompt": p})
                                 for i, p in enumerate(["the world again and again", "again the world"])) + "\n")
    return model, write_random_drafts(model, root / "drafts", draft_vocab=200), prompts


# the grid -----------------------------------------------------------------------------------------
def test_the_grid_parses_knobs_and_values() -> None:
    assert parse_grid("num_steps=3,4; eagle_topk=1,4") == {"num_steps": [3, 4], "eagle_topk": [1, 4]}
    assert parse_grid("ngram_match_type=bfs,prob;num_draft_tokens=8") == {
        "ngram_match_type": ["BFS", "PROB"], "num_draft_tokens": [8]}
    assert parse_grid("num_steps=3,3,4") == {"num_steps": [3, 4]}
    assert parse_grid("ngram_corpus=on,off") == {"ngram_corpus": [True, False]}
    assert parse_grid(None) == {}


@pytest.mark.parametrize(("text", "says"), [
    ("warp=3", "unknown knob 'warp'"),
    ("num_steps", "num_steps needs values"),
    ("num_steps=", "num_steps needs values"),
    ("num_steps=3;num_steps=4", "given twice"),
    ("num_steps=three", "num_steps takes integers, not 'three'"),
    ("ngram_corpus=maybe", "ngram_corpus takes on or off, not 'maybe'"),
    ("adaptive_draft=1", "unknown knob 'adaptive_draft'"),
    (" ; ", "--grid is empty"),
])
def test_a_bad_grid_is_one_clear_line(text: str, says: str) -> None:
    with pytest.raises(UserError) as err:
        parse_grid(text)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_refused_settings_are_noted_and_chains_run_once() -> None:
    base = SpecConfig(max_new_tokens=8)
    search = Search.build("eagle3", {"num_steps": [3], "eagle_topk": [1, 4, 8], "num_draft_tokens": [4, 8, 16]}, base)
    configs = [s.config for s in search.points.values()]
    # topk 1 is a chain of num_steps + 1 tokens whatever the tree size: one setting, not three
    assert sum(c.eagle_topk == 1 for c in configs) == 1
    assert next(c for c in configs if c.eagle_topk == 1).num_draft_tokens == 4
    # topk 4 with 4 tokens, topk 8 with 4 or 8 tokens: more than the tree holds
    assert {(r["knobs"]["eagle_topk"], r["knobs"]["num_draft_tokens"]) for r in search.refused} == {
        (4, 4), (8, 4), (8, 8)}
    assert all("eagle_topk" in r["reason"] for r in search.refused)
    assert all(not c.adaptive_draft for c in configs)  # static trees, as a server runs them


def test_the_coarse_grid_goes_first_then_the_neighbours_of_the_best() -> None:
    search = Search.build("ngram", {"num_draft_tokens": [4, 8, 16, 32, 64], "ngram_max_bfs_breadth": [1, 4, 10]},
                          SpecConfig())
    first = search.next_batch(100)
    assert {(s.config.num_draft_tokens, s.config.ngram_max_bfs_breadth) for s in first} == {
        (n, b) for n in (4, 16, 64) for b in (1, 10)}
    for s in first:
        search.record(s, 100.0 if (s.config.num_draft_tokens, s.config.ngram_max_bfs_breadth) == (16, 10) else 1.0)
    nearest = {(s.config.num_draft_tokens, s.config.ngram_max_bfs_breadth) for s in search.next_batch(3)}
    assert nearest == {(8, 10), (32, 10), (16, 4)}  # one grid step from the best


# the sweep ----------------------------------------------------------------------------------------
def _tune(model: Path, prompts: Path, *flags: str) -> int:
    return main(["tune", str(model), "--prompts", str(prompts), "--max-new-tokens", "12", "--threads", "1", *flags])


def test_the_sweep_measures_every_setting_checks_identity_and_saves_settings(tiny, tmp_path: Path, capsys) -> None:
    model, drafts, prompts = tiny
    out, saved = tmp_path / "tune.json", tmp_path / "best.json"
    assert _tune(model, prompts, "--methods", "ngram,eagle3", "--draft", str(drafts["eagle3"]),
                 "--grid", "num_draft_tokens=4,8;eagle_topk=1,4;num_steps=2;ngram_max_bfs_breadth=1,4",
                 "--json", str(out), "--save-settings", str(saved)) == 0
    report = json.loads(out.read_text())
    results = report["results"]
    # ngram: 2 x 2; eagle3: a chain (topk 1) and topk 4 with 8 tokens (topk 4 with 4 tokens is refused)
    assert sorted(r["setting"] for r in results) == sorted([
        "ngram draft_tokens=4 max_bfs_breadth=1", "ngram draft_tokens=4 max_bfs_breadth=4",
        "ngram draft_tokens=8 max_bfs_breadth=1", "ngram draft_tokens=8 max_bfs_breadth=4",
        "eagle3 steps=2 topk=1 draft_tokens=3", "eagle3 steps=2 topk=4 draft_tokens=8"])
    assert [r["knobs"] for r in report["skipped"]] == [{"num_steps": 2, "eagle_topk": 4, "num_draft_tokens": 4}]
    assert report["planned"] == report["measured"] == 6 and not report["stopped_by_budget"]
    assert all(r["identical_to_baseline"] and r["prompts"] == 2 for r in results)
    assert [r["tokens_per_s"] for r in results] == sorted((r["tokens_per_s"] for r in results), reverse=True)
    assert all(len(r["accepted_by_depth"]) <= 7 for r in results)
    assert report["adaptive_draft"] is False and report["machine"]["cpu"]
    winners = report["winners"]
    assert set(winners) == {"ngram", "eagle3"}
    assert winners["eagle3"]["vllm"]["command"].startswith("vllm serve ")
    assert f"--speculative-draft-model-path {drafts['eagle3']}" in winners["eagle3"]["sglang"]["command"]
    text = capsys.readouterr().out
    assert "SGLang:" in text and "vLLM:" in text and "python -m sglang.launch_server" in text
    assert "the best settings on a CPU are not the best on a GPU" in text
    # the settings file: what `specchat run --settings` reads back, the same config as the winner's
    best = report["best"]
    assert load_settings(saved) == best["settings"]  # written with tune's mark, which --settings skips
    loaded = config_from_args(options_for(build_parser().parse_args(["run", "--settings", str(saved)])))
    assert loaded == SpecConfig().replace(**best["settings"])
    assert loaded.method == best["method"] and loaded.adaptive_draft is False
    assert {k: getattr(loaded, k) for k in best["knobs"]} == best["knobs"]


def test_a_setting_that_answers_differently_is_reported_loudly(tiny, tmp_path: Path, monkeypatch, capsys) -> None:
    model, _, prompts = tiny
    real = tune.run_ours

    def broken(session, prompt, config, split=None):
        run = real(session, prompt, config, split)
        if config.method == "ngram" and config.num_draft_tokens == 8:
            return type(run)([*run.tokens[:-1], run.tokens[-1] + 1], run.steps, run.produced, run.seconds,
                             run.prefill_s)
        return run

    monkeypatch.setattr(tune, "run_ours", broken)
    out = tmp_path / "t.json"
    assert _tune(model, prompts, "--methods", "ngram", "--grid", "num_draft_tokens=4,8;ngram_max_bfs_breadth=2",
                 "--json", str(out)) == 1
    report = json.loads(out.read_text())
    assert set(report["winners"]) == {"ngram"} and report["winners"]["ngram"]["knobs"]["num_draft_tokens"] == 4
    assert len(report["mismatches"]) == 1 and "BUG: ngram draft_tokens=8" in report["mismatches"][0]
    assert "BUG: ngram draft_tokens=8" in capsys.readouterr().err


def test_the_budget_stops_the_sweep(tiny, tmp_path: Path, monkeypatch) -> None:
    """A fake clock that moves 1000 s a reading, past a 1-minute budget at once: the first batch
    still runs one setting (something to report), cut after its first prompt; nothing after it."""
    model, _, prompts = tiny
    now = [0.0]

    def clock() -> float:
        now[0] += 1000.0
        return now[0]

    monkeypatch.setattr(tune, "CLOCK", clock)
    out = tmp_path / "t.json"
    assert _tune(model, prompts, "--methods", "ngram", "--minutes", "1", "--json", str(out)) == 0
    report = json.loads(out.read_text())
    assert report["stopped_by_budget"] is True
    assert report["measured"] == 1 and report["planned"] == 15  # 5 tree sizes x 3 breadths
    assert report["results"][0]["prompts"] == 1 and report["results"][0]["identical_to_baseline"]
    assert report["winners"]["ngram"]["setting"].startswith("ngram ")


def test_a_method_the_session_cannot_run_is_skipped_with_its_reason(tiny, tmp_path: Path, capsys) -> None:
    model, _, prompts = tiny
    out = tmp_path / "t.json"
    grid = "num_draft_tokens=4;ngram_max_bfs_breadth=1;eagle_topk=1;num_steps=2"
    assert _tune(model, prompts, "--methods", "ngram,eagle3", "--grid", grid,
                 "--json", str(out)) == 0  # no --draft: this model has no EAGLE-3 head
    report = json.loads(out.read_text())
    assert set(report["winners"]) == {"ngram"} and report["measured"] == 1
    assert [s["method"] for s in report["skipped"]] == ["eagle3"] and "--draft" in report["skipped"][0]["reason"]
    assert "eagle3 cannot run here, skipped" in capsys.readouterr().out


def test_flags_fix_a_knob_and_bad_flags_fail_before_loading(tiny, tmp_path: Path, capsys) -> None:
    model, _, prompts = tiny
    assert tune.method_axes("ngram", {}, {"num_draft_tokens"}) == {"ngram_max_bfs_breadth": [1, 4, 10]}
    assert tune.method_axes("eagle3", {"num_steps": [2], "ngram_max_bfs_breadth": [3]}, set())["num_steps"] == [2]
    for flags, says in [
        (["--methods", "warp"], "unknown method 'warp'"),
        (["--methods", "none"], "tune needs a method"),
        (["--methods", "ngram", "--grid", "num_steps=3"], "num_steps acts on none of ngram"),
        (["--methods", "ngram", "--temperature", "0.7"], "greedy"),
        (["--methods", "ngram", "--minutes", "0"], "--minutes: must be a number above 0"),
        (["--methods", "ngram", "--json", str(tmp_path)], "is a folder"),
    ]:
        assert _tune(model, prompts, *flags) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and len(err.splitlines()) == 1


def test_the_budget_counts_the_slowest_answer_and_cuts_late_batches(monkeypatch) -> None:
    now = [0.0]
    monkeypatch.setattr(tune, "CLOCK", lambda: now[0])
    budget = tune.Budget(deadline=100.0, answer_s=2.0)
    now[0] = 50.0
    assert budget.fits(25) and not budget.fits(26)  # 50 s + 25 answers x 2 s
    assert not budget.over() and not budget.stopped
    now[0] = 101.0
    assert budget.over() and budget.stopped
    assert tune.Budget(deadline=None, answer_s=9.0).fits(10**6)


def test_the_embedded_models_shipped_head_names_the_eagle3_draft() -> None:

    head = tune._shipped_head(None, "eagle3")
    assert head is not None and Path(head, "config.json").is_file()
    assert tune._shipped_head("smollm2-135m", "eagle3") == head
    assert tune._shipped_head(None, "ngram") is None
    assert tune._shipped_head("org/other", "eagle3") is None
