"""``specchat tune``: sweep the tree knobs on the user's prompts and hand back launch lines.

Why: the serving guides say to sweep ``num-steps``, ``eagle-topk`` and ``num-draft-tokens`` on
your own traffic and keep what maximises measured tokens/s, not acceptance. This does it in one
process, the way ``specchat bench`` measures (its loader, warm-up, timed answer and tallies are
reused, not copied): the adaptive budget off, since a server runs static trees; each batch of
settings timed prompt by prompt beside a baseline answer, so noise on the machine lands on all
alike; every answer checked identical to the baseline's (greedy: a difference is a bug).

With ``--minutes`` the coarse grid (each knob's ends, and its middle on long ranges) goes first,
then the settings nearest the best so far, batch by batch while the budget allows. Read top to
bottom in :func:`run_tune`: check the flags, load, warm up, search, report.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine import methods
from engine.config import METHOD_KNOBS, ConfigError, knobs_for
from engine.errors import UserError
from engine.outputs import Output, check_outputs
from engine.prompts import Prompt, load_prompts
from specchat.bench import check_prompts_fit, load_sessions, run_ours, weights_modes
from specchat.bench_report import Row, StepSplit, machine_info
from specchat.bench_warmup import capture_graphs, size_cache_for
from specchat.export import EMBEDDED_HUB_ID, SERVERS, launch_line, serving_model
from specchat.options import ALGORITHMS, UsageError, given_knobs, make_config, spec_overrides

if TYPE_CHECKING:
    from engine.config import SpecConfig
    from specchat.command_options import TuneOptions

# each method's grid, as its registration declares it (engine/method_spec.py: TREE_GRID, SGLang's
# ranges for the tree methods). --grid replaces a knob's values, a flag fixes it.
DEFAULT_GRIDS: dict[str, dict[str, list[Any]]] = {
    m.name: {k: list(v) for k, v in m.tune_grid.items()} for m in methods.all_methods() if m.tune_grid}
GRID_KNOBS: tuple[str, ...] = tuple(dict.fromkeys(k for knobs in METHOD_KNOBS.values() for k in knobs))
SHORT = {"num_steps": "steps", "eagle_topk": "topk", "num_draft_tokens": "draft_tokens"}
MAX_BATCH = 4  # settings timed together beside one baseline answer per prompt
# what tune writes; each marked as its own, so a later tune may replace it (and nothing else without --force)
TUNE_JSON = Output("tune", "--json", "json", example="tune.json")
TUNE_SETTINGS = Output("tune", "--save-settings", "json", example="settings.json")  # --settings skips the mark
CLOCK: Callable[[], float] = time.monotonic  # the budget's clock (tests replace it: no timed tests)


# the grid -------------------------------------------------------------------------------------
def parse_grid(text: str | None) -> dict[str, list[Any]]:
    """``'num_steps=3,4;eagle_topk=1,4'`` -> {"num_steps": [3, 4], "eagle_topk": [1, 4]}; one-line
    errors for an unknown knob, a knob without values or named twice, a value of the wrong type."""
    from engine.config import SpecConfig

    grid: dict[str, list[Any]] = {}
    for part in (text or "").split(";"):
        if not part.strip():
            continue
        name, eq, values = (s.strip() for s in part.partition("="))
        if name not in GRID_KNOBS:
            raise UsageError(f"--grid: unknown knob {name!r}; choose from {', '.join(GRID_KNOBS)}")
        listed = [v.strip() for v in values.split(",") if v.strip()]
        if not eq or not listed:
            raise UsageError(f"--grid: {name} needs values, as in '{name}=3,4'")
        if name in grid:
            raise UsageError(f"--grid: {name} is given twice; list all its values once, as in '{name}=3,4'")
        default = getattr(SpecConfig, name)
        grid[name] = [_grid_value(name, v, default) for v in dict.fromkeys(listed)]
        _check_bounds(name, grid[name])
    if text is not None and not grid:
        raise UsageError("--grid is empty; write e.g. 'num_steps=3,4;eagle_topk=1,4'")
    return grid


def _check_bounds(name: str, values: list[Any]) -> None:
    """A value outside its knob's own bounds is a typing mistake, refused before the model loads (a
    point that only some combination refuses, as top-k above the tree size, is noted by Search)."""
    from engine.knobs import KNOBS

    try:
        for value in values:
            KNOBS[name].check(value)
    except ConfigError as exc:
        raise UsageError(f"--grid: {exc}") from None


def _grid_value(name: str, value: str, default: Any) -> Any:
    if isinstance(default, bool):  # ngram_corpus=on,off: does the corpus pay on these prompts?
        flag = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}.get(value.lower())
        if flag is None:
            raise UsageError(f"--grid: {name} takes on or off, not {value!r}")
        return flag
    if isinstance(default, int):
        try:
            return int(value)
        except ValueError:
            raise UsageError(f"--grid: {name} takes integers, not {value!r}") from None
    return value.upper() if name == "ngram_match_type" else value


def method_axes(method: str, grid: dict[str, list[Any]], fixed: set[str]) -> dict[str, list[Any]]:
    """The knobs swept for ``method``: the default ranges, --grid over them, flags fixing a knob."""
    axes = {k: v for k, v in DEFAULT_GRIDS.get(method, {}).items() if k not in fixed}
    axes.update({k: v for k, v in grid.items() if k in METHOD_KNOBS.get(method, ())})
    return axes


def point_config(base: SpecConfig, method: str, knobs: dict[str, Any], given: Collection[str]) -> SpecConfig:
    """The config a grid point of ``method`` runs, the budget off: its knobs and the settings the user
    gave (``given``), over the method's own defaults (a block drafter's chain where the grid names no top-k)."""
    return base.replace(adaptive_draft=False, **knobs).with_method(method, {*given, *knobs})


@dataclass(frozen=True)
class Setting:
    """One point of a method's grid and the config it runs (adaptive budget off)."""

    method: str
    knobs: tuple[tuple[str, Any], ...]
    config: SpecConfig

    @property
    def label(self) -> str:
        knobs = " ".join(f"{SHORT.get(k, k.removeprefix('ngram_'))}={v}" for k, v in self.knobs)
        return f"{self.method} {knobs}".strip()


@dataclass
class Search:
    """One method's grid: the coarse points first, then those nearest the best measured so far."""

    method: str
    axes: dict[str, list[Any]]
    points: dict[tuple[int, ...], Setting] = field(default_factory=dict)
    coarse: list[tuple[int, ...]] = field(default_factory=list)
    refused: list[dict[str, Any]] = field(default_factory=list)
    speed: dict[SpecConfig, float] = field(default_factory=dict)  # measured tok/s (None-free: failures dropped)
    tried: set[SpecConfig] = field(default_factory=set)

    @classmethod
    def build(cls, method: str, axes: dict[str, list[Any]], base: SpecConfig, given: Collection[str] = ()) -> Search:
        """Every point of the grid as a config (:func:`point_config`); a point the config refuses is
        noted, not run, and points that run the same config (top-k 1 chains, whatever their tree size)
        are run once."""
        search = cls(method, axes)
        names = list(axes)
        seen: set[SpecConfig] = set()
        for idx in itertools.product(*(range(len(axes[n])) for n in names)):
            knobs = {n: axes[n][i] for n, i in zip(names, idx, strict=True)}
            try:
                config = point_config(base, method, knobs, given)
                if methods.is_tree(method) and config.tree_width == 1:
                    knobs["num_draft_tokens"] = methods.chain_size(config.num_steps)
                    config = config.replace(num_draft_tokens=knobs["num_draft_tokens"])
            except ConfigError as exc:
                search.refused.append({"method": method, "knobs": knobs, "reason": str(exc)})
                continue
            if config not in seen:
                seen.add(config)
                search.points[idx] = Setting(method, tuple(knobs.items()), config)
        ends = [sorted({0, len(axes[n]) // 2, len(axes[n]) - 1} if len(axes[n]) >= 5 else {0, len(axes[n]) - 1})
                for n in names]
        search.coarse = [idx for idx in itertools.product(*ends) if idx in search.points]
        return search

    @property
    def planned(self) -> int:
        return len(self.points)

    def next_batch(self, size: int) -> list[Setting]:
        """Coarse points not yet run, else the untried points nearest (in grid steps) the best."""
        todo = [i for i in self.coarse if self.points[i].config not in self.tried]
        if not todo:
            best = max((i for i in self.points if self.points[i].config in self.speed),
                       key=lambda i: self.speed[self.points[i].config], default=None)
            todo = sorted((i for i in self.points if self.points[i].config not in self.tried),
                          key=lambda i: (_distance(i, best), i))
        return [self.points[i] for i in todo[:size]]

    def record(self, setting: Setting, tokens_per_s: float | None) -> None:
        self.tried.add(setting.config)
        if tokens_per_s is not None:
            self.speed[setting.config] = tokens_per_s


def _distance(a: tuple[int, ...], b: tuple[int, ...] | None) -> int:
    return 0 if b is None else sum(abs(x - y) for x, y in zip(a, b, strict=True))


class DepthSplit(StepSplit):
    """bench's draft/verify split, plus how many steps accepted at least d drafts, per depth d."""

    def __init__(self) -> None:
        super().__init__()
        self.at_least: list[int] = []  # steps that accepted at least d drafts, d = 1, 2, ...

    def add(self, step: Any) -> None:
        super().add(step)
        n = len(step.accepted)
        self.at_least += [0] * (n - len(self.at_least))
        for d in range(n):
            self.at_least[d] += 1

    def by_depth(self) -> list[float]:
        return [round(c / self.steps, 3) for c in self.at_least] if self.steps else []


@dataclass
class Budget:
    """``--minutes``: a batch starts only if it ends in time with every answer as slow as the
    slowest seen (the warm-up's pace first); past the deadline a batch stops before its next
    prompt. The first batch runs at least one setting, and keeps what it measured if cut, so there
    is always something to report; a later batch cut short is dropped (its prompts differ)."""

    deadline: float | None
    answer_s: float = 0.0  # the slowest answer seen (s): what a batch's answers are budgeted at
    batches: int = 0
    stopped: bool = False

    def fits(self, answers: int) -> bool:
        return self.deadline is None or CLOCK() + answers * self.answer_s <= self.deadline

    def over(self) -> bool:
        if self.deadline is None or CLOCK() <= self.deadline:
            return False
        self.stopped = True
        return True

    def left(self) -> str:
        if self.deadline is None:
            return "no limit"
        return f"{max(0.0, self.deadline - CLOCK()) / 60:.1f} min budget left"


# running --------------------------------------------------------------------------------------
@dataclass
class Sweep:
    """What the search measured: results per setting, the baseline, refusals, mismatches."""

    mode: str
    baseline: Row
    results: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)


def run_tune(options: TuneOptions) -> int:
    """Check the flags, load, warm up, search within the budget, report."""
    start = CLOCK()
    base = make_config(options.spec, method="none", max_new_tokens=256)
    if not base.greedy:
        raise UsageError("tune measures greedy answers (each checked identical to the baseline's); "
                         "drop --temperature")
    methods = tune_methods(options.methods)
    grid = parse_grid(options.grid)
    fixed = set(spec_overrides(options.spec))  # a knob given as a flag is not swept (a settings file sets the base)
    unused = [k for k in grid if not any(k in METHOD_KNOBS.get(m, ()) for m in methods)]
    if unused:
        raise UsageError(f"--grid: {', '.join(unused)} acts on none of {', '.join(methods)}")
    given = given_knobs(options.spec)
    searches = [Search.build(m, method_axes(m, grid, fixed), base, given) for m in methods]
    prompts = load_prompts(options.prompts, options.limit)
    modes = weights_modes(options.target)
    if len(modes) > 1:
        raise UsageError("tune measures one weights mode: give one --weights and one --precision")
    check_outputs([(TUNE_JSON, options.json_out), (TUNE_SETTINGS, options.save_settings)], force=options.force)
    session = load_sessions(options, base, modes)[modes[0]]
    check_prompts_fit("tune", session, prompts, _every_config(base, searches))
    baseline = base.replace(method="none")
    sweep = Sweep(modes[0], Row("none", modes[0]))
    for search in searches:
        sweep.skipped += [{**r, "reason": f"refused by the config: {r['reason']}"} for r in search.refused]
    budget = Budget(None if options.minutes is None else start + 60 * options.minutes)  # > 0: the parser
    searches = _warm_up(session, prompts, baseline, searches, sweep, budget)
    _search(session, prompts, baseline, searches, sweep, budget)
    report = _report(options, base, session, searches, sweep, budget, CLOCK() - start)
    print_report(report)
    if options.json_out:
        TUNE_JSON.write_json(options.json_out, report, default=str)
    if options.save_settings and report["best"] is not None:
        TUNE_SETTINGS.write_json(options.save_settings, report["best"]["settings"])
        print(f"settings saved: specchat run{_model_arg(options)} --settings {options.save_settings}")
    return 1 if sweep.mismatches else 0


def tune_methods(text: str | None) -> list[str]:
    """``--methods``: the methods to tune (the baseline runs anyway); one line for a bad name."""
    names = [m.strip().lower() for m in (text or "").split(",") if m.strip()]
    for name in names:
        if name not in ALGORITHMS:
            raise UsageError(f"unknown method {name!r}; choose from {', '.join(m for m in ALGORITHMS if m != 'none')}")
    methods = list(dict.fromkeys(ALGORITHMS[n] for n in names if ALGORITHMS[n] != "none"))
    if not methods:
        raise UsageError("tune needs a method to tune, e.g. --methods ngram,eagle3")
    return methods


def _every_config(baseline: SpecConfig, searches: list[Search]) -> list[SpecConfig]:
    """The baseline's config and every setting's the search may time (what the cache and the
    context must hold room for)."""
    return [baseline, *(s.config for search in searches for s in search.points.values())]


def _warm_up(session: Any, prompts: list[Prompt], baseline: SpecConfig, searches: list[Search],
             sweep: Sweep, budget: Budget) -> list[Search]:
    """One short untimed answer per method (a method the session cannot run is dropped with its
    reason, loudly); on CUDA the caches sized first, and every graph the settings left replay captured."""
    size_cache_for(session, prompts, _every_config(baseline, searches))
    warm = run_ours(session, prompts[0], baseline.replace(max_new_tokens=8))
    prefill = warm.prefill_s or 0.0  # the first batch's pace: this prefill, then every token as fast as these
    budget.answer_s = prefill + (warm.seconds - prefill) / max(1, len(warm.tokens)) * baseline.max_new_tokens
    kept = []
    for search in searches:
        first = next(iter(search.points.values()), None)
        if first is None:
            continue
        try:
            run_ours(session, prompts[0], first.config.replace(max_new_tokens=8))
        except UserError as exc:
            print(f"tune: {search.method} cannot run here, skipped: {exc}")
            sweep.skipped.append({"method": search.method, "knobs": {}, "reason": str(exc)})
            continue
        kept.append(search)
    capture_graphs(session, _every_config(baseline, kept))
    return kept


def _search(session: Any, prompts: list[Prompt], baseline: SpecConfig, searches: list[Search], sweep: Sweep,
            budget: Budget) -> None:
    """Batch by batch, method by method, while any setting is left and the budget allows."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    total = sum(s.planned for s in searches) * len(prompts)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeRemainingColumn(), TextColumn("{task.fields[left]}"))
    # no auto-refresh thread: a thread waking 10 times a second steals a core from the model
    with Progress(*columns, transient=True, auto_refresh=False) as bar:
        task = bar.add_task("tuning", total=total, left=budget.left())
        active = list(searches)
        while active and not budget.stopped:
            for search in list(active):
                batch = search.next_batch(MAX_BATCH)
                if not batch:  # this method's grid is done
                    active.remove(search)
                    continue
                fitting = list(batch)
                while fitting and not budget.fits((len(fitting) + 1) * len(prompts)):
                    fitting.pop()  # fewer settings beside the baseline, if that fits
                if not fitting and budget.batches:
                    budget.stopped = True
                    break
                batch = fitting or batch[:1]
                _measure(session, prompts, baseline, search, batch, sweep, budget,
                         lambda d: _tick(bar, task, d, budget))
                budget.batches += 1


def _tick(bar: Any, task: Any, description: str | None, budget: Budget) -> None:
    if description is None:
        bar.advance(task)
    else:
        bar.update(task, description=description, left=budget.left())
    bar.refresh()


def _measure(session: Any, prompts: list[Prompt], baseline: SpecConfig, search: Search, batch: list[Setting],
             sweep: Sweep, budget: Budget, tick: Callable[[str | None], None]) -> None:
    """Each prompt: the baseline, then every setting of the batch; a setting the session refuses
    is dropped with its reason. Results are compared with this batch's baseline."""
    rows = {s: Row(s.label, sweep.mode, split=DepthSplit()) for s in batch}
    base = Row("none", sweep.mode)
    for i, prompt in enumerate(prompts):
        if i and budget.over():
            if budget.batches:
                return  # a later batch cut short: its settings stay unmeasured
            break  # the first: what it measured is reported, on fewer prompts
        run = run_ours(session, prompt, baseline)
        reference = {sweep.mode: run.tokens, None: run.tokens}
        base.add(run, reference)
        sweep.baseline.add(run, reference)
        for setting in list(rows):
            tick(f"{prompt.id}: {setting.label}")
            try:
                rows[setting].add(run_ours(session, prompt, setting.config, rows[setting].split), reference)
            except UserError as exc:
                del rows[setting]
                search.record(setting, None)
                sweep.skipped.append({"method": setting.method, "knobs": dict(setting.knobs), "reason": str(exc)})
            tick(None)
    budget.answer_s = max([budget.answer_s, *(r.seconds / r.prompts for r in (base, *rows.values()) if r.prompts)])
    for setting, row in rows.items():
        result = {**row.result(base, sweep.mode), "method": setting.method, "setting": setting.label,
                  "knobs": dict(setting.knobs), "accepted_by_depth": row.split.by_depth(),  # type: ignore[attr-defined]
                  "baseline_tokens_per_s": round(base.tokens_per_s, 2)}  # the baseline timed beside it
        sweep.results.append(result)
        identical = result["identical_to_baseline"]
        search.record(setting, result["tokens_per_s"] if identical else None)
        if not identical:
            _say_mismatch(setting, result, sweep)


def _say_mismatch(setting: Setting, result: dict[str, Any], sweep: Sweep) -> None:
    """Greedy speculative decoding is lossless: a different answer is a bug, said loudly."""
    from rich.console import Console

    line = (f"BUG: {setting.label} answered {result['prompts'] - result['identical_prompts']} of "
            f"{result['prompts']} prompts differently from the baseline; greedy speculation must be lossless. "
            "Please report it with this command line.")
    sweep.mismatches.append(line)
    Console(stderr=True).print(f"[bold red]{line}[/]")


# reporting ------------------------------------------------------------------------------------
def _report(options: TuneOptions, base: SpecConfig, session: Any, searches: list[Search], sweep: Sweep,
            budget: Budget, elapsed: float) -> dict[str, Any]:
    """Everything, for --json: the machine, the results by tok/s, the winners and their launch lines."""
    results = sorted(sweep.results, key=lambda r: r["tokens_per_s"], reverse=True)
    winners: dict[str, Any] = {}
    for r in results:
        if r["identical_to_baseline"] and r["method"] not in winners:
            winners[r["method"]] = _winner(options, base, r)
    best = max(winners.values(), key=lambda w: w["tokens_per_s"], default=None)
    planned = sum(s.planned for s in searches)
    return {
        "machine": machine_info(session.model), "model": session.model_name, "prompts_file": str(options.prompts),
        "mode": sweep.mode, "max_new_tokens": base.max_new_tokens, "adaptive_draft": False,
        "budget_minutes": options.minutes, "elapsed_s": round(elapsed, 1), "stopped_by_budget": budget.stopped,
        "planned": planned, "measured": len(results),
        "baseline": sweep.baseline.result(sweep.baseline, sweep.mode), "results": results,
        "skipped": sweep.skipped, "mismatches": sweep.mismatches,
        "winners": winners, "best": best,
    }


def _winner(options: TuneOptions, base: SpecConfig, result: dict[str, Any]) -> dict[str, Any]:
    """A method's best setting: its settings file (the method and its knobs) and both launch lines."""
    config = point_config(base, result["method"], result["knobs"], given_knobs(options.spec))
    settings = {"method": config.method, **{k: getattr(config, k) for k in knobs_for(config.method)}}
    model = options.target.model
    draft = options.spec.draft or _shipped_head(model, config.method)
    return {"method": result["method"], "setting": result["setting"], "knobs": result["knobs"],
            "tokens_per_s": result["tokens_per_s"], "speedup": result["speedup"], "settings": settings,
            **{server: launch_line(server, config, model, draft).to_dict() for server in SERVERS}}


def _shipped_head(model: str | None, method: str) -> str | None:
    """The head shipped for the embedded model that every session on it loads (the registration that
    preloads: EAGLE-3's), which ran without --draft (its folder)."""
    from engine.drafters.draft_loader import shipped_heads
    from engine.models.resolve import EMBEDDED_NAME

    spec = methods.get(method)
    if spec is None or spec.draft is None or not spec.draft.preload or serving_model(model) != EMBEDDED_HUB_ID:
        return None
    head = shipped_heads(EMBEDDED_NAME).get(method)
    return str(head) if head is not None else None


def _model_arg(options: TuneOptions) -> str:
    model, draft = options.target.model, options.spec.draft
    return (f" {model}" if model else "") + (f" --draft {draft}" if draft else "")


def print_report(report: dict[str, Any]) -> None:
    """The table (by tok/s), where it was measured, each method's winner with its launch lines."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # a pipe or file: do not squeeze the table into 80 columns
        console = Console(width=160)
    machine = report["machine"]
    where = f"{machine['cpu']} ({machine['threads']} threads" + (f", GPU {machine['gpu']})" if machine.get("gpu")
                                                                 else ", no GPU)")
    table = Table(title=f"specchat tune: {report['model']} on {where}, adaptive budget off")
    for col in ("setting", "tokens/s", "tau", "speedup", "accepted per depth", "identical"):
        table.add_column(col, justify="left" if col in ("setting", "accepted per depth") else "right")
    base = report["baseline"]
    rows = [*report["results"], {**base, "setting": "none (baseline)", "accepted_by_depth": []}]
    for r in sorted(rows, key=lambda r: r["tokens_per_s"], reverse=True):
        table.add_row(r["setting"], f"{r['tokens_per_s']:.2f}", "-" if r["tau"] is None else f"{r['tau']:.2f}",
                      f"{r['speedup']:.2f}x" if r["speedup"] else "-",
                      " ".join(f"{a:.2f}" for a in r["accepted_by_depth"][:8]) or "-",
                      f"{r['identical_prompts']}/{r['prompts']}",
                      style=None if r["identical_to_baseline"] else "bold red")
    console.print(table)
    console.print(f"measured {report['measured']} of {report['planned']} settings in {report['elapsed_s']:.0f} s"
                  + (" (stopped by the --minutes budget)" if report["stopped_by_budget"] else "")
                  + f" on {where}; the best settings on a CPU are not the best on a GPU: tune where you serve.")
    for skipped in report["skipped"]:
        knobs = " ".join(f"{k}={v}" for k, v in skipped["knobs"].items())
        console.print(f"skipped {skipped['method']}{' ' + knobs if knobs else ''}: {skipped['reason']}",
                      style="yellow", markup=False)
    for winner in report["winners"].values():
        console.print(f"\n[bold]best {winner['method']}[/]: {winner['setting']}, {winner['tokens_per_s']:.2f} tok/s"
                      + (f" ({winner['speedup']:.2f}x)" if winner["speedup"] else ""))
        for server in SERVERS:
            line = winner[server]
            console.print(f"{line['server']}:", style="bold")
            console.print(line["command"], markup=False, soft_wrap=True)
            for note in line["notes"]:
                console.print(f"  note: {note}", style="dim", markup=False)
    for line in report["mismatches"]:
        console.print(line, style="bold red", markup=False)
