"""``specchat bench --plot FILE.svg``: the table (and the cost curve) as an SVG; a bad path is
refused in one line before any model loads."""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import pytest

from specchat.bench_plot import write_bench_svg, write_cost_svg
from specchat.cli import main

RESULT = {"weights": "stored", "precision": "exact", "mode": "stored", "decode_tokens_per_s": None,
          "decode_speedup": None, "identical_to_baseline": True, "prompts": 2, "identical_prompts": 2,
          "draft_ms_per_step": None, "verify_ms_per_step": None, "paused_share": None}
REPORT = {
    "model": "tiny-test-model",
    "machine": {"cpu": "Test CPU", "threads": 2},
    "weights": ["stored"],
    "results": [
        {**RESULT, "method": "none", "tokens_per_s": 21.37, "tau": 1.0, "speedup": 1.0, "tokens": 96,
         "seconds": 4.49},
        {**RESULT, "method": "ngram", "tokens_per_s": 47.25, "tau": 2.61, "speedup": 2.211, "tokens": 96,
         "seconds": 2.03, "draft_ms_per_step": 0.42, "verify_ms_per_step": 35.1, "paused_share": 0.125},
    ],
}


def svg_text(path: Path) -> str:
    """The text an SVG shows (rich writes each run of one style as its own <text>, spaces as &#160;)."""
    return html.unescape("".join(re.findall(r">([^<]*)</text>", path.read_text(encoding="utf-8")))).replace("\xa0", " ")


def test_bench_svg_has_the_tables_numbers(tmp_path: Path) -> None:
    out = write_bench_svg(str(tmp_path / "bench.svg"), REPORT)
    assert out.read_text(encoding="utf-8").startswith("<!-- written_by specchat bench --plot -->\n<svg")
    text = svg_text(out)
    for number in ("21.37", "47.25", "2.61", "2.21x", "0.42|35.10", "12%", "2/2"):
        assert number in text, number
    assert "tiny-test-model" in text and "tokens/s" in text
    assert "ngram" in text and "none" in text


def test_cost_svg_has_the_curve_and_its_numbers(tmp_path: Path) -> None:
    from rich.table import Table

    table = Table(title="one target forward over n tree tokens")
    table.add_column("n")
    table.add_column("ms")
    curve = [{"n": 1, "ms": 11.5, "relative": 1.0}, {"n": 8, "ms": 13.75, "relative": 1.196},
             {"n": 32, "ms": 27.25, "relative": 2.37}]
    for row in curve:
        table.add_row(str(row["n"]), f"{row['ms']:.2f}")
    out = write_cost_svg(str(tmp_path / "cost.svg"), table, {"specchat stored": curve}, "tiny-test-model")
    text = svg_text(out)
    for number in ("11.50", "13.75", "27.25"):
        assert number in text, number
    assert "ms per target forward" in text and "specchat stored" in text  # the chart and its legend
    assert "●" in text  # the measured sizes are marked


def _refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, plot: str, *needles: str) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n', encoding="utf-8")
    # a hub id that cannot exist (the pre-flight leaves hub ids to the loader): reaching the load would
    # fail differently (and much later)
    assert main(["bench", "no-such-org/no-such-model-anywhere", "--prompts", str(prompts), "--plot", plot]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert "--plot" in err[0] and "no-such-model" not in err[0]
    for needle in needles:
        assert needle in err[0]


def test_plot_must_be_an_svg(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _refused(capsys, tmp_path, str(tmp_path / "bench.png"), ".svg")


def test_plot_in_a_folder_that_is_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x", encoding="utf-8")
    _refused(capsys, tmp_path, str(blocker / "bench.svg"), "not a folder")


def test_plot_that_is_a_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "out.svg").mkdir()
    _refused(capsys, tmp_path, str(tmp_path / "out.svg"), "folder")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc takes no new files on Linux only")
def test_plot_in_an_unwritable_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Even root cannot create a file in /proc: the write is tried, not only the permission bits."""
    _refused(capsys, tmp_path, "/proc/specchat-bench.svg", "cannot write")


def test_plot_with_another_benchmark_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", "--train-speed", "--plot", str(tmp_path / "x.svg")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "--plot" in err[0]


def test_a_gpu_run_names_the_gpu_and_its_precision() -> None:
    """On a GPU the host CPU only feeds it: the title names the GPU, the dtype and the graphs
    (session 25's first H200 table said 'on Intel(R) Xeon(R) Processor (16 threads ...)')."""
    from specchat.bench_report import results_table

    cpu = results_table(REPORT).title
    assert cpu == "tiny-test-model on Test CPU (2 threads, weights stored)"
    gpu = {**REPORT, "dtype": "bfloat16", "weights": ["fp32"], "cuda_graphs": {"fp32": {"replays": 9}},
           "machine": {"cpu": "Test CPU", "threads": 16, "gpu": "NVIDIA H200"}}
    assert results_table(gpu).title == "tiny-test-model on NVIDIA H200 (bfloat16, CUDA graphs, weights fp32)"
    for linear, words in (("invariant", "invariant linears"), ("cublas", "cuBLAS linears")):
        run = {**gpu, "machine": {**gpu["machine"], "cuda_linear": linear}}
        want = f"tiny-test-model on NVIDIA H200 (bfloat16, CUDA graphs, {words}, weights fp32)"
        assert results_table(run).title == want


def test_rejection_sampling_rows_show_no_identical_count() -> None:
    """Rejection sampling draws another sample than plain sampling by design, so "0/2 identical"
    would read as a failure: the drafted rows show "-", the baseline its own count."""
    from specchat.bench_report import results_table

    def identical_cells(report: dict) -> list[str]:
        table = results_table(report)
        column = next(c for c in table.columns if c.header == "identical")
        return list(column.cells)

    assert identical_cells(REPORT) == ["2/2", "2/2"]
    sampled = {**REPORT, "config": {"temperature": 1.0, "sampling": "rejection"}}
    assert identical_cells(sampled) == ["2/2", "-"]
    assert identical_cells({**REPORT, "config": {"temperature": 1.0, "sampling": "coupled"}}) == ["2/2", "2/2"]
