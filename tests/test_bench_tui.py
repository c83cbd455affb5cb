"""``specchat bench --tui``: the pairs' arithmetic, and the whole command on a tiny model (the chat
as `specchat run` starts it, its engine in its own process)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from heads import write_tiny_model

from specchat.bench_report import BENCH_JSON
from specchat.bench_tui import BAR, Pair, Parity, print_parity
from specchat.cli import main


def _pair(engine: float, chat: float, steps: tuple[int, int] = (9, 9)) -> Pair:
    return Pair(engine, chat, *steps, tokens=64, frames=6, elapsed_s=0.5)


def test_the_verdict_is_the_median_of_the_paired_ratios() -> None:
    """Each chat answer against the headless one just before it: a slow moment of the machine
    lands on both sides of its pair, not on the verdict (the medians of each side would say 1.0)."""
    parity = Parity((_pair(100, 90), _pair(200, 100), _pair(150, 150)))
    assert parity.ratio == 0.9
    assert parity.same_work
    assert parity.pairs[0].frames_per_s == 12.0
    assert not Parity((_pair(100, 90), _pair(100, 90, (9, 10)))).same_work


def test_the_table_says_whether_the_aim_is_met_and_flags_different_work() -> None:
    out = io.StringIO()
    print_parity(Parity((_pair(100, 80, (9, 11)),)), out)
    text = out.getvalue()
    assert "9/11" in text and "0.80" in text
    assert f"misses the chat's aim of {BAR}x" in text
    assert "verified different trees" in text


def test_bench_tui_end_to_end_on_a_tiny_model(tmp_path: Path, capsys) -> None:
    """One pair on a tiny random model: the chat loads in its own process, answers the same prompt
    with the same steps as the headless session, and the report is bench's JSON."""
    model = write_tiny_model(tmp_path / "model")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "again and again and again"}) + "\n")
    out = tmp_path / "t.json"
    assert main(["bench", str(model), "--tui", "1", "--prompts", str(prompts), "--max-new-tokens", "12",
                 "--threads", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert BENCH_JSON.owns(out)  # a later run may replace it without --force
    assert report["kind"] == "tui" and report["method"] == "ngram"
    assert report["config"]["adaptive_draft"] is False  # both sides verify the same trees
    (pair,) = report["pairs"]
    assert pair["engine_steps"] == pair["chat_steps"] > 0
    assert pair["tokens"] > 0
    assert "median paired ratio" in capsys.readouterr().out
