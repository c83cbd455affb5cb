"""The charts view (F9): acceptance by depth, tokens per step, and the verify-cost curve the
adaptive budget has learned with where it cut the last tree.

The screen draws a :class:`ChartData` the app feeds with every record (chart_data.py); it listens
while open and redraws at most every ``REDRAW_S`` while an answer streams, so a fast engine costs
the charts a few plotext builds a second, not one per token. Colours come from the active theme's
variables at each render (the same colour means the same thing as in the token stream: an accepted
draft, a target token, a refused draft), so switching theme recolours the charts.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any, ClassVar, cast

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.color import Color
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Static
from textual_plotext import PlotextPlot

from specchat.plots import RGB, Series, draw_bars, draw_xy, unlimit
from specchat.tui.chart_data import ChartData, ChartView, DepthRate

REDRAW_S = 0.25
MAX_DEPTHS = 10  # depths drawn in the acceptance chart (deeper ones are rarely reached)

EMPTY_TEXT = (
    "No answer yet.\n\n"
    "Type a prompt in the chat (Esc goes back); these charts fill in while the answer streams:\n\n"
    "· acceptance by depth, for the answer and the whole session\n"
    "· tokens committed per verify step\n"
    "· the verify cost the adaptive budget has learned, and where it cut the tree"
)

Colours = dict[str, RGB]
Drawer = Callable[[Any, ChartView, Colours, int], None]


def theme_rgb(variables: dict[str, str]) -> Colours:
    """The theme colours the charts use, as RGB (plotext takes tuples)."""
    names = {"answer": "tok-draft", "target": "tok-target", "rejected": "tok-rejected", "session": "label",
             "points": "primary"}
    out: Colours = {}
    for key, var in names.items():
        colour = Color.parse(variables.get(var) or variables.get("foreground") or "#888888")
        out[key] = (colour.r, colour.g, colour.b)
    return out


def draw_depth(plt: Any, view: ChartView, colours: Colours, width: int) -> None:
    depths = max(len(view.answer_depth), len(view.session_depth))
    depths = min(depths, MAX_DEPTHS)
    if not depths:
        plt.title("no drafted step yet")
        return

    def rates(found: tuple[DepthRate, ...]) -> list[float]:
        by_depth = {r.depth: r.rate for r in found}
        return [by_depth.get(d, 0.0) for d in range(1, depths + 1)]

    labels = [str(d) for d in range(1, depths + 1)]
    draw_bars(plt, labels, [(rates(view.answer_depth), colours["answer"]),
                            (rates(view.session_depth), colours["session"])], ylim=(0, 1))
    plt.yticks([0, 0.5, 1], ["0", "50%", "100%"])


def steps_shown(view: ChartView, width: int) -> int:
    """How many of the answer's last steps fit as bars (two cells each)."""
    return max(1, min(len(view.committed), (width - 6) // 2))


def draw_steps(plt: Any, view: ChartView, colours: Colours, width: int) -> None:
    if not view.committed:
        plt.title("waiting for the first step")
        return
    n = steps_shown(view, width)
    first = len(view.committed) - n
    shown = view.committed[first:]
    xs = list(range(first, first + n))
    draw_bars(plt, xs, [([d for d, _ in shown], colours["answer"]), ([t for _, t in shown], colours["target"])],
              stacked=True)
    every = max(1, -(-n * 4 // max(8, width - 6)))  # a label per 4 cells at most (plotext's own vary)
    plt.xticks([x for x in xs if (x - first) % every == 0])
    top = max(d + t for d, t in shown)
    plt.ylim(0, top)
    plt.yticks(sorted({0, top // 2, top}))


def last_cut(view: ChartView) -> tuple[int, int] | None:
    """The last step's (verified size, proposed size); proposed 0 when unknown or drafting paused."""
    if not view.cuts:
        return None
    cut = view.cuts[-1]
    return cut.kept, cut.proposed


def draw_cost(plt: Any, view: ChartView, colours: Colours, width: int) -> None:
    if not view.cost_curve:
        plt.title("no verify timed yet")
        return
    marks: list[tuple[float, RGB]] = []
    cut = last_cut(view)
    if cut is not None:
        kept, proposed = cut
        if proposed > kept:
            marks.append((proposed, colours["rejected"]))
        marks.append((kept, colours["answer"]))
    draw_xy(plt, [Series(view.cost_curve, colours["session"]), Series(view.cost_measured, colours["points"],
                                                                       points=True)], marks=marks)


def cost_legend(view: ChartView) -> str:
    """The cost chart's subtitle: the marks' meaning, with the last steps' cuts (proposed→verified)."""
    if not view.cuts:
        return ""
    cut = view.cuts[-1]
    if cut.paused:
        now = "[$tok-draft]│[/] drafting paused: root only"
    elif cut.proposed > cut.kept:
        now = f"[$tok-draft]│[/] verified {cut.kept} [$tok-rejected]│[/] proposed {cut.proposed}"
    else:
        now = f"[$tok-draft]│[/] verified {cut.kept} (not cut)"
    history = " ".join(f"{c.proposed}→{c.kept}" if c.proposed > c.kept else str(c.kept) for c in view.cuts[:-1][-4:])
    return f"{now} · [$primary]●[/] measured" + (f" · earlier {history}" if history else "")


class Chart(PlotextPlot):
    """A plotext chart that draws the latest view with the active theme's colours at each render."""

    def __init__(self, drawer: Drawer, *, id: str) -> None:
        super().__init__(id=id)
        self.drawer = drawer
        self.view = ChartView()

    def show(self, view: ChartView) -> None:
        self.view = view
        self.refresh()

    def render(self) -> Any:
        plt = self.plt
        plt.clear_figure()
        unlimit(plt)
        self.drawer(plt, self.view, theme_rgb(self.app.theme_variables), self.size.width)
        return super().render()


class ChartsScreen(Screen[None]):
    DEFAULT_CSS = """
    ChartsScreen #charts-title {
        dock: top; height: 1; background: $panel; color: $foreground; padding: 0 1;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    ChartsScreen #charts-empty {
        display: none; height: auto; margin: 2 4; padding: 1 2; border: round $primary; color: $foreground;
    }
    ChartsScreen.-empty #charts-empty { display: block; }
    ChartsScreen.-empty #charts-body { display: none; }
    ChartsScreen #charts-top { height: 1fr; }
    ChartsScreen Chart {
        height: 1fr; background: $surface; border: round $panel;
        border-title-color: $foreground; border-subtitle-color: $label;
    }
    """
    BINDINGS: ClassVar = [Binding("escape,q", "close", "Back", id="charts-close")]

    def __init__(self, data: ChartData) -> None:
        super().__init__(id="charts")
        self.data = data
        self.drawn = -1  # the data version on screen
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="charts-title")
        yield Static(EMPTY_TEXT, id="charts-empty")
        with Vertical(id="charts-body"):
            with Horizontal(id="charts-top"):
                yield Chart(draw_depth, id="chart-depth")
                yield Chart(draw_steps, id="chart-steps")
            yield Chart(draw_cost, id="chart-cost")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#chart-depth").border_title = "acceptance by depth"
        self.data.subscribe(self._changed)
        self.redraw()

    def on_unmount(self) -> None:
        self.data.unsubscribe(self._changed)

    def on_resize(self) -> None:
        self.redraw()

    def _changed(self) -> None:
        if self._timer is None:
            self._timer = self.set_timer(REDRAW_S, self.redraw)

    def redraw(self) -> None:
        """Show the data as it is now (called at most every REDRAW_S while records arrive)."""
        self._timer = None
        view = self.data.view()
        self.drawn = self.data.version
        self.set_class(view.empty, "-empty")
        state = "streaming" if view.streaming else "done"
        self.query_one("#charts-title", Static).update(
            "Charts · no answer yet" if view.empty else
            f"Charts · {view.method or '?'} · answer {view.answers} ({state}) · F9 or Esc: back")
        depth, steps, cost = (self.query_one(f"#chart-{n}", Chart) for n in ("depth", "steps", "cost"))
        depth.border_subtitle = "[$tok-draft]■[/] this answer  [$label]■[/] session"
        shown = steps_shown(view, steps.size.width or 40)
        steps.border_title = f"tokens per step (last {shown} of {len(view.committed)})" if view.committed else \
            "tokens per step"
        steps.border_subtitle = "[$tok-draft]■[/] drafts kept  [$tok-target]■[/] target token"
        cost.border_title = f"verify ms by tree size (learned by the budget{', ' + view.method if view.method else ''})"
        cost.border_subtitle = cost_legend(view)
        for chart in (depth, steps, cost):
            chart.show(view)

    def action_close(self) -> None:
        self.app.pop_screen()


class ChartsHost:
    """The app's side of the charts view, mixed into the app: the session's chart data (the app
    feeds it every record) and the key that shows and hides the view.

    Why a mixin: the data must outlive the screen (session-wide acceptance), so the app holds it,
    and the app module is at its size limit; this keeps everything about charts in this module.
    """

    @cached_property
    def charts(self) -> ChartData:
        return ChartData()

    def action_toggle_charts(self) -> None:
        app = cast(App[Any], self)
        if isinstance(app.screen, ChartsScreen):
            app.pop_screen()
        else:
            app.push_screen(ChartsScreen(self.charts))
