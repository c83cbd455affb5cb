"""``bench --rounds``: the order rows run in, what the report says of the rounds, and the read-bandwidth
probe. Structure only: every timing here is synthetic (a Run's seconds) or a fake clock's, never the
machine's, so nothing depends on how fast the machine is or what runs beside it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from heads import write_tiny_model
from rich.console import Console

from engine.prompts import Prompt
from engine.read_bandwidth import (
    ReadBandwidth,
    buffer_bytes,
    last_level_cache_bytes,
    measure_read_bandwidth,
)
from specchat.bench import Runner, _time_rounds
from specchat.bench_bandwidth import PROBES_A_ROUND, decode_bandwidth, decode_bandwidth_lines, probe_after
from specchat.bench_report import BENCH_JSON, Row, Run
from specchat.bench_rounds import disagreements, round_order, round_results, rounds_table, row_results
from specchat.cli import main

ANSWER = list(range(5, 16))  # 11 tokens: 10 decoded after the first
PREFILL = 0.01  # seconds of every synthetic answer before its first token


def timed_run(rate: float, tokens: list[int] = ANSWER, peer: bool = False) -> Run:
    """An answer of ``tokens`` decoding at ``rate`` tok/s after a prefill (a peer's: no prefill apart,
    ``rate`` then its tok/s over the whole answer)."""
    decode = (len(tokens) - 1) / rate
    if peer:
        return Run(tokens, 0, len(tokens), len(tokens) / rate, None)
    return Run(tokens, len(tokens), len(tokens), PREFILL + decode, PREFILL)


def synthetic_table(rates: dict[str, list[float]], prompts: int = 2) -> list[list[Row]]:
    """``table[round][row]`` of rows named by ``rates`` ("none", "ngram", "peer" for a peer), each
    decoding at the given rate in each round, every answer ``ANSWER``."""
    rounds = len(next(iter(rates.values())))
    table = []
    for r in range(rounds):
        rows = []
        for name, per_round in rates.items():
            row = Row(name, None if name == "peer" else "stored")
            for _ in range(prompts):
                row.add(timed_run(per_round[r], peer=name == "peer"), {"stored": ANSWER, None: ANSWER})
            rows.append(row)
        table.append(rows)
    return table


# the order --------------------------------------------------------------------------------------
def test_round_order_alternates() -> None:
    assert [round_order(3, r) for r in range(4)] == [[0, 1, 2], [2, 1, 0], [0, 1, 2], [2, 1, 0]]
    assert round_order(1, 1) == [0]


def test_rounds_run_every_row_of_every_prompt_in_the_alternated_order() -> None:
    """Round 1: each prompt through A B C; round 2: through C B A; round 3: A B C again. The probe
    runs at each round's start; each round's rows come back in the table's order, whatever the
    order they ran in, and each its own tallies."""
    calls: list[str] = []

    def runner(name: str, mode: str | None) -> Runner:
        def run(prompt: Prompt, split: object) -> Run:
            calls.append(f"{prompt.id}:{name}")
            return timed_run(100.0, peer=mode is None)

        return Runner(name, name, mode, run)

    def probe() -> ReadBandwidth:
        calls.append("probe")
        return ReadBandwidth(50.0, 1 << 28, 1 << 25, 1, 5)

    runners = [runner("none", "stored"), runner("ngram", "stored"), runner("peer", None)]
    prompts = [Prompt("p1", text="a"), Prompt("p2", text="b")]
    table, probes = _time_rounds(prompts, runners, 3, probe)
    forward = ["p1:none", "p1:ngram", "p1:peer", "p2:none", "p2:ngram", "p2:peer"]
    backward = ["p1:peer", "p1:ngram", "p1:none", "p2:peer", "p2:ngram", "p2:none"]
    # a probe at each round's start and after each prompt (at most PROBES_A_ROUND a round)
    forward = [forward[0], forward[1], forward[2], "probe", *forward[3:], "probe"]
    backward = [backward[0], backward[1], backward[2], "probe", *backward[3:], "probe"]
    assert calls == ["probe", *forward, "probe", *backward, "probe", *forward]
    assert [len(p) for p in probes] == [3, 3, 3]
    assert [[row.name for row in rows] for rows in table] == [["none", "ngram", "peer"]] * 3
    assert all(row.prompts == 2 and row.identical == 2 for rows in table for row in rows)
    assert len({id(row) for rows in table for row in rows}) == 9  # a fresh tally per round


def test_every_round_is_checked_against_the_first_rounds_baseline() -> None:
    """A baseline whose answer changes in round 2 (a greedy decode that is not deterministic) is
    counted as not identical, and so is every row that follows it: no round compares only with itself."""
    def make(name: str, answers: list[list[int]]) -> Runner:
        seen = iter(answers * 4)
        return Runner(name, name, "stored", lambda prompt, split: timed_run(100.0, next(seen)))

    drifted = [*ANSWER[:-1], 99]
    runners = [make("none", [ANSWER, drifted]), make("ngram", [ANSWER, drifted])]
    table, _ = _time_rounds([Prompt("p1", text="a")], runners, 2, None)
    results = row_results(table, "stored")
    assert [r["identical_prompts"] for r in results] == [0, 0]  # identical in round 1, not in round 2
    assert [[x["identical_prompts"] for x in r["rounds"]] for r in results] == [[1, 0], [1, 0]]
    assert not any(r["identical_to_baseline"] for r in results)


def test_bench_rounds_end_to_end_on_a_tiny_model(tmp_path: Path, monkeypatch) -> None:
    """``bench --rounds 2`` on a tiny random model: the timed answers come in the alternated order,
    the JSON holds both rounds of every row (identical in each), and the bandwidth section one
    probe a round."""
    import specchat.bench as bench

    model = write_tiny_model(tmp_path / "model")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "again and again"}) + "\n" + json.dumps({"prompt": "one two"}) + "\n")
    order: list[str] = []
    real = bench.run_ours

    def recording(session, prompt, config, split=None):
        if config.max_new_tokens == 6:  # the timed answers, not the warm-up's 8 tokens
            order.append(f"{prompt.id}:{config.method}")
        return real(session, prompt, config, split)

    monkeypatch.setattr(bench, "run_ours", recording)
    out = tmp_path / "r.json"
    assert main(["bench", str(model), "--prompts", str(prompts), "--methods", "none,ngram", "--max-new-tokens", "6",
                 "--threads", "1", "--rounds", "2", "--json", str(out)]) == 0
    first, second = (p.id for p in bench.load_prompts(str(prompts), None))
    assert order == [f"{first}:none", f"{first}:ngram", f"{second}:none", f"{second}:ngram",
                     f"{first}:ngram", f"{first}:none", f"{second}:ngram", f"{second}:none"]
    report = json.loads(out.read_text())
    assert report["rounds"] == 2
    for result in report["results"]:
        assert len(result["rounds"]) == 2 and result["identical_prompts"] == 2
        assert all(r["identical_prompts"] == 2 for r in result["rounds"])
        assert result["decode_tokens_per_s"] == max(r["decode_tokens_per_s"] for r in result["rounds"])
    section = report["decode_bandwidth"]
    assert len(section["measured_read"]["gbps_by_round"]) == 2 and section["measured_read"]["threads"] == 1
    assert len(section["baselines"][report["weights"][0]]["gbps_by_round"]) == 2


def test_one_round_reports_as_before(tmp_path: Path) -> None:
    """The default, one round: the results are one round's, with no rounds fields and no "rounds" key."""
    table = synthetic_table({"none": [100.0], "ngram": [130.0]})
    assert row_results(table, "stored") == round_results(table[0], "stored")
    assert "rounds" not in row_results(table, "stored")[1]


# the report -------------------------------------------------------------------------------------
def test_the_report_gives_each_round_the_best_and_the_median() -> None:
    """Per row: each round's decode tok/s and ratio, the best round, the medians, and the ratio best
    over best (which need not be any one round's ratio)."""
    table = synthetic_table({"none": [100.0, 80.0, 120.0], "ngram": [130.0, 120.0, 132.0]})
    base, ngram = row_results(table, "stored")
    assert [r["decode_tokens_per_s"] for r in ngram["rounds"]] == [130.0, 120.0, 132.0]
    assert [r["decode_speedup"] for r in ngram["rounds"]] == [1.3, 1.5, 1.1]
    assert ngram["decode_tokens_per_s"] == 132.0 and ngram["best_round"] == 3
    assert ngram["median_decode_tokens_per_s"] == 130.0 and ngram["median_decode_speedup"] == 1.3
    assert ngram["decode_speedup"] == 1.1  # 132 / 120: the best of each
    assert base["decode_speedup"] == 1.0 and base["spread"] == 0.5  # (120 - 80) / 80
    assert ngram["identical_prompts"] == 2 and ngram["identical_to_baseline"]


def test_a_peer_row_is_compared_by_its_tokens_per_second() -> None:
    """A peer reports no prefill apart, so its rounds and its ratio are in tok/s, against our
    baseline's tok/s, never against our decode rate."""
    table = synthetic_table({"none": [100.0, 100.0], "peer": [90.0, 95.0]})
    base, peer = row_results(table, "stored")
    assert peer["decode_tokens_per_s"] is None and peer["decode_speedup"] is None
    assert peer["tokens_per_s"] == 95.0 and peer["speedup"] == round(95.0 / base["tokens_per_s"], 3)
    text = _text(rounds_table({"rounds": 2, "results": [base, peer], "weights": ["stored"]}))
    assert "peer *" in text and "a peer reports no prefill" in text


def test_the_warning_fires_when_the_rounds_spread_more_than_the_rows_differ() -> None:
    """Baseline rounds 20% apart and n-gram 1.10x best over best: the 10% is within the noise."""
    results = row_results(synthetic_table({"none": [100.0, 120.0], "ngram": [110.0, 132.0]}), "stored")
    warning = disagreements(results)
    assert warning is not None and "\n" not in warning
    assert "ngram vs none (rounds 20% and 20% apart, rows 10%)" in warning


def test_the_warning_fires_on_the_rows_own_spread() -> None:
    results = row_results(synthetic_table({"none": [100.0, 101.0], "ngram": [100.0, 130.0]}), "stored")
    assert "ngram vs none (rounds 30% and 1% apart, rows 29%)" in disagreements(results)


def test_no_warning_when_the_difference_stands_out_of_the_noise() -> None:
    results = row_results(synthetic_table({"none": [100.0, 103.0], "ngram": [150.0, 152.0],
                                           "peer": [60.0, 61.0]}), "stored")
    assert disagreements(results) is None
    assert disagreements(row_results(synthetic_table({"none": [100.0], "ngram": [101.0]}), "stored")) is None


def test_the_warning_names_every_noisy_row_on_one_line() -> None:
    results = row_results(synthetic_table({"none": [100.0, 120.0], "ngram": [105.0, 125.0], "eagle3": [300.0, 330.0],
                                           "peer": [100.0, 101.0]}), "stored")
    warning = disagreements(results)
    assert "ngram vs none" in warning and "peer vs none" in warning and "eagle3" not in warning
    assert warning.count("\n") == 0


def test_the_report_round_trips_through_json(tmp_path: Path) -> None:
    """--json carries every round: a report read back gives the same results, table, warning and
    bandwidth lines as the run that wrote it."""
    table = synthetic_table({"none": [100.0, 120.0], "ngram": [110.0, 132.0], "peer": [90.0, 91.0]})
    results = row_results(table, "stored")
    probes = [[ReadBandwidth(40.0, 1 << 28, 1 << 25, 2, 5)], [ReadBandwidth(50.0, 1 << 28, 1 << 25, 2, 5)] * 2]
    report = {"model": "m", "rounds": 2, "weights": ["stored"], "results": results,
              "decode_bandwidth": decode_bandwidth({"stored": 4 * 10**8}, results, probes)}
    path = tmp_path / "r.json"
    BENCH_JSON.write_json(str(path), report)
    loaded = json.loads(path.read_text())
    assert loaded["results"] == results
    assert disagreements(loaded["results"]) == disagreements(results) is not None
    assert _text(rounds_table(loaded)) == _text(rounds_table(report))
    assert decode_bandwidth_lines(loaded["decode_bandwidth"]) == decode_bandwidth_lines(report["decode_bandwidth"])


def _text(table: object) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


# the bandwidth ----------------------------------------------------------------------------------
def test_the_bandwidth_line_gives_gbps_and_the_share_of_the_measured_bandwidth() -> None:
    """0.4 GB a token at 100 and 120 tok/s: 40 and 48 GB/s; the probe 50 and 60 GB/s: 80% each
    round, and best over best 48 / 60."""
    results = row_results(synthetic_table({"none": [100.0, 120.0], "ngram": [150.0, 170.0]}), "stored")
    probes = [[ReadBandwidth(50.0, 1 << 30, 1 << 25, 2, 5)], [ReadBandwidth(60.0, 1 << 30, 1 << 25, 2, 5)]]
    section = decode_bandwidth({"stored": 4 * 10**8}, results, probes)
    base = section["baselines"]["stored"]
    assert base["gbps_by_round"] == [40.0, 48.0] and base["share_by_round"] == [0.8, 0.8] and base["share"] == 0.8
    assert section["measured_read"]["gbps_by_round"] == [50.0, 60.0] and section["measured_read"]["best_gbps"] == 60
    assert decode_bandwidth_lines(section) == [
        "baseline: 48.0 GB/s of weights read = 80.0% of measured read bandwidth 60.0 GB/s "
        "(best of 2 rounds each; by round 80% 80%)"]


def test_a_rounds_reference_is_the_mean_of_its_probes_and_the_fastest_probe_is_said() -> None:
    """A round's rows take minutes, a probe a tenth of a second: one probe that caught a burst of the
    memory's speed (80 GB/s among 40s) must not stand for the whole round. The round's probes are
    averaged; the fastest alone is still reported."""
    results = row_results(synthetic_table({"none": [100.0, 110.0]}), "stored")
    def bw(gbps: float) -> ReadBandwidth:
        return ReadBandwidth(gbps, 1 << 30, 1 << 25, 2, 5)
    probes = [[bw(40.0), bw(50.0), bw(45.0)], [bw(80.0), bw(40.0), bw(44.0)]]
    section = decode_bandwidth({"stored": 4 * 10**8}, results, probes)
    base = section["baselines"]["stored"]
    read = section["measured_read"]
    assert read["gbps_by_round"] == [45.0, 54.667] and read["best_gbps"] == 54.667 and read["fastest_probe_gbps"] == 80
    assert base["share_by_round"] == [round(40 / 45, 4), round(44 / (164 / 3), 4)]
    assert base["share"] == round(44 / (164 / 3), 4) and base["share_of_fastest_probe"] == 0.55
    assert decode_bandwidth_lines(section) == [
        "baseline: 44.0 GB/s of weights read = 80.5% of measured read bandwidth 54.7 GB/s "
        "(the mean of 3 probes through a round; best of 2 rounds each; by round 89% 80%); "
        "55.0% of the fastest single probe (80.0 GB/s)"]


def test_probes_are_spread_through_a_round() -> None:
    """After every prompt of a short round; evenly, at most PROBES_A_ROUND times, in a long one; always
    after its last prompt."""
    assert [p for p in range(3) if probe_after(p, 3)] == [0, 1, 2]
    long = [p for p in range(80) if probe_after(p, 80)]
    assert len(long) == PROBES_A_ROUND and long[-1] == 79
    assert [p for p in range(10) if probe_after(p, 10)] == [1, 3, 5, 7, 9]


def test_the_bandwidth_line_without_a_probe_or_with_weights_in_the_cache() -> None:
    """No probe (a GPU): the GB/s alone. Weights that fit in the last-level cache: said, since their
    share of the memory's bandwidth may pass 100%."""
    results = row_results(synthetic_table({"none": [100.0]}), "stored")
    assert decode_bandwidth_lines(decode_bandwidth({"stored": 4 * 10**8}, results, [])) == [
        "baseline: 40.0 GB/s of weights read"]
    small = decode_bandwidth({"stored": 10**7}, results, [[ReadBandwidth(0.5, 1 << 28, 1 << 25, 1, 5)]])
    (line,) = decode_bandwidth_lines(small)
    assert line.startswith("baseline: 1.0 GB/s of weights read = 200.0% of measured read bandwidth 0.5 GB/s; its "
                           "10.00 MB of weights fit in the 32 MiB last-level cache")
    assert decode_bandwidth({}, results, []) is None  # not our model: no weights counted, no section


def test_the_probe_measures_a_positive_bandwidth_and_restores_the_threads() -> None:
    before = torch.get_num_threads()
    probe = measure_read_bandwidth(threads=1, passes=2, nbytes=8 << 20)
    assert probe.gbps > 0 and probe.buffer_bytes == 8 << 20 and probe.threads == 1 and probe.passes == 2
    assert torch.get_num_threads() == before


def test_the_probe_takes_the_best_pass() -> None:
    """Passes of 3, 1 and 2 ms on a fake clock over 4 MB: 4 GB/s, the fastest pass's."""
    ticks = iter([0.0, 0.003, 1.0, 1.001, 2.0, 2.002])
    probe = measure_read_bandwidth(threads=1, passes=3, nbytes=4 * 10**6, clock=lambda: next(ticks))
    assert probe.gbps == pytest.approx(4.0)
    with pytest.raises(ValueError, match="passes"):
        measure_read_bandwidth(passes=0)


def test_the_last_level_cache_is_summed_over_its_instances(tmp_path: Path) -> None:
    """Two CCXs of 32 MiB L3 each (shared by CPUs 0-1 and 2-3), an L2 per CPU, an instruction cache:
    64 MiB; a system that says nothing: 0."""
    def cache(cpu: int, index: int, level: int, kind: str, size: str, shared: str) -> None:
        folder = tmp_path / f"cpu{cpu}" / "cache" / f"index{index}"
        folder.mkdir(parents=True)
        for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (folder / name).write_text(f"{value}\n")

    for cpu in range(4):
        cache(cpu, 0, 1, "Instruction", "32K", str(cpu))
        cache(cpu, 1, 2, "Unified", "1024K", str(cpu))
        cache(cpu, 2, 3, "Unified", "32768K", "0-1" if cpu < 2 else "2-3")
    assert last_level_cache_bytes(tmp_path) == 64 << 20
    assert last_level_cache_bytes(tmp_path / "nothing") == 0


def test_the_probe_buffer_outsizes_the_cache_within_bounds() -> None:
    assert buffer_bytes(32 << 20, None) == 1 << 30  # 8 x 32 MiB is under the minimum
    assert buffer_bytes(260 << 20, None) == 2080 << 20  # a 260 MB-L3 Xeon: 8 of them
    assert buffer_bytes(32 << 20, None, at_least=3 << 30) == 3 << 30  # never smaller than the weights
    assert buffer_bytes(4 << 30, None) == 4 << 30  # capped
    assert buffer_bytes(260 << 20, 1 << 30) == 256 << 20  # a quarter of the memory available
