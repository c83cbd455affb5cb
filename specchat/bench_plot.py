"""``specchat bench --plot FILE.svg``: the bench table and a chart as one SVG image, for a README.

Why SVG through rich: the table is the one the terminal shows (bench_report.results_table), recorded
by a rich console and exported with the chart under it (plotext text with its colours), so the
image says exactly what the run printed, and renders in any browser or on GitHub.
The path is checked before any model loads (:func:`check_plot_path`): a bad one would otherwise
end a run of minutes with the results lost. The image's first line marks it as bench's own (engine/outputs.py):
a later ``--plot`` may replace it, and no other file without ``--force``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from engine.outputs import Output
from specchat.command_options import BenchOptions
from specchat.options import UsageError
from specchat.plots import RGB, Series, draw_xy, new_figure

BENCH_PLOT = Output("bench", "--plot", "svg", example="bench.svg")
WIDTH = 160  # columns of the image: the table as `bench` prints it to a file, none of its cells wrapped
CHART_HEIGHT = 16
# series colours, readable on the dark background of rich's SVG export (the TUI's dark theme)
COLOURS: tuple[RGB, ...] = ((88, 166, 255), (78, 191, 113), (210, 153, 34), (244, 112, 103), (137, 87, 229))


def check_plot_path(options: BenchOptions) -> None:
    """Refuse a ``--plot`` this benchmark cannot draw or that is no SVG, in one line, before any benchmark
    work (whether the path can be written: bench checks it with --json, engine/outputs.py)."""
    path = options.plot
    if not path:
        return
    if options.other_benchmark() not in (None, "--cost-curve"):
        raise UsageError("--plot draws the method table or --cost-curve; drop it for this benchmark")
    if Path(path).suffix.lower() != ".svg":
        raise UsageError(f"--plot {path}: the image is SVG; name a .svg file (e.g. --plot bench.svg)")


def _svg(path: str, title: str, *renderables: Any) -> Path:
    from rich.console import Console

    console = Console(record=True, width=WIDTH, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    for renderable in renderables:
        console.print(renderable)
    return BENCH_PLOT.write(path, BENCH_PLOT.mark_svg(console.export_svg(title=title)))


def _chart(plt: Any, title: str) -> Any:
    from rich.text import Text

    plt.title(title)
    return Text.from_ansi(plt.build())


def write_bench_svg(path: str, report: dict[str, Any]) -> Path:
    """The results table, then tokens/s per row as bars (the baseline's among them)."""
    from specchat.bench_report import results_table

    results = report["results"]
    multi = len(report.get("weights") or ()) > 1
    labels = [(f"{r['method']} ({r['mode']})" if multi and r.get("mode") else r["method"]) +
              (f" {r['speedup']:.2f}x" if r.get("speedup") else "") for r in results]
    plt = new_figure(WIDTH, 2 * len(results) + 5)  # one bar a row apart, however many rows
    # plotext stacks horizontal bars from the bottom: reversed, they read in the table's order
    plt.bar(labels[::-1], [r["tokens_per_s"] for r in results][::-1], orientation="horizontal", color=COLOURS[0],
            width=0.5)
    chart = _chart(plt, "tokens/s, prefill included (speed-up against the baseline)")
    return _svg(path, f"specchat bench · {report['model']}", results_table(report), chart)


def write_cost_svg(path: str, table: Any, curves: dict[str, list[dict[str, float]]], model: str) -> Path:
    """The cost-curve table, then ms against tree size, one line per curve (its sizes marked)."""
    plt = new_figure(WIDTH, CHART_HEIGHT)
    series = []
    for i, (name, curve) in enumerate(curves.items()):
        xy = [(row["n"], row["ms"]) for row in curve]
        colour = COLOURS[i % len(COLOURS)]
        series += [Series(xy, colour, label=name), Series(xy, colour, points=True)]
    draw_xy(plt, series, xlabel="tree tokens verified in one forward", legend=True)
    plt.xticks(sorted({row["n"] for curve in curves.values() for row in curve}))
    chart = _chart(plt, "ms per target forward")
    return _svg(path, f"specchat bench --cost-curve · {model}", table, chart)
