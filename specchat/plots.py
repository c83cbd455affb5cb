"""Terminal charts drawn with plotext, shared by the TUI's charts view and ``specchat bench --plot``.

Why one module: the verify-cost curve is the same picture in both places (ms against tree size),
so it is drawn by one function; callers hand in colours (the TUI takes them from the active theme,
the bench SVG from a fixed palette). Figures come from textual-plotext's :class:`Plot`, a plotext
figure of its own, so two charts never share plotext's global figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class Series:
    """Points to draw: a line through them (``points=False``) or the points alone."""

    xy: Sequence[tuple[float, float]]
    color: RGB
    points: bool = False
    label: str = ""


def new_figure(width: int, height: int) -> Any:
    """A standalone plotext figure of ``width`` x ``height`` cells, on the terminal's own colours."""
    from textual_plotext.plot import Plot

    plt = Plot()
    unlimit(plt)
    plt.plotsize(width, height)
    plt.theme("clear")
    return plt


def unlimit(plt: Any) -> None:
    """Draw at the size asked for, not clamped to the size of the terminal that runs the command
    (a bench writing an SVG from a narrow terminal, tests whose terminal size varies). plotext's
    figures have no public switch (its module-level ``limitsize`` acts on the global figure)."""
    plt._limit_size(False, False)


def draw_xy(plt: Any, series: Sequence[Series], *, marks: Sequence[tuple[float, RGB]] = (),
            xlabel: str = "", legend: bool = False, ticks: int = 8) -> None:
    """Lines and points on one axis from 0 up, with vertical marks (e.g. where a budget cut a tree)."""
    top = max((y for s in series for _, y in s.xy), default=1.0)
    for s in series:
        if not s.xy:
            continue
        xs, ys = zip(*s.xy, strict=True)
        label = s.label if legend and s.label else None
        if s.points:
            plt.scatter(list(xs), list(ys), color=s.color, marker="●", label=label)
        else:
            plt.plot(list(xs), list(ys), color=s.color, marker="braille", label=label)
    for x, color in marks:
        plt.vline(x, color)
    y_axis(plt, top)
    xs = sorted({x for s in series for x, _ in s.xy} | {x for x, _ in marks})
    if xs and all(float(x).is_integer() for x in xs):  # sizes: whole ticks, not 6.2
        span = int(xs[-1] - xs[0])
        plt.xticks(list(range(int(xs[0]), int(xs[-1]) + 1, max(1, -(-span // ticks)))))
    if xlabel:
        plt.xlabel(xlabel)


def y_axis(plt: Any, top: float) -> None:
    """From 0 to a little over ``top``, with three ticks: they read at any height (plotext's own
    land unevenly on a chart a few rows high)."""
    top = top * 1.1 or 1.0
    plt.ylim(0, top)
    plt.yticks([0, top / 2, top], ["0", *(f"{v:.0f}" if v >= 100 else f"{v:.3g}" for v in (top / 2, top))])


def draw_bars(plt: Any, labels: Sequence[str] | Sequence[int], groups: Sequence[tuple[Sequence[float], RGB]], *,
              stacked: bool = False, ylim: tuple[float, float] | None = None) -> None:
    """Bars per label: one series beside another (or stacked), each in its colour, no legend
    (callers label the colours where they have room: a legend inside a small chart hides bars)."""
    values = [list(v) for v, _ in groups]
    colors = [c for _, c in groups]
    if len(groups) == 1:
        plt.bar(list(labels), values[0], color=colors[0], width=0.8)
    elif stacked:
        plt.stacked_bar(list(labels), values, color=colors, width=0.8)
    else:
        plt.multiple_bar(list(labels), values, color=colors, width=0.8)
    if ylim is not None:
        plt.ylim(*ylim)
    else:
        y_axis(plt, max(map(sum, zip(*values, strict=True))) if stacked else max(max(v) for v in values))
