"""``specchat bench --cost-curve``: what one target forward costs over n tree tokens, relative to n = 1.

Why: speculation pays only while verifying n tokens costs much less than n forwards of one, so
this curve decides how big a draft tree is worth verifying on a machine. ``gpu_bench`` measures
the same curve on a random model of any shape.
"""

from __future__ import annotations

from typing import Any

from specchat.command_options import BenchOptions
from specchat.options import UsageError

SIZES = (1, 2, 4, 8, 16, 32, 64)  # tree tokens per measured forward


def measure_cost_curve(model: Any, context: int, sizes: tuple[int, ...] = SIZES
                       ) -> list[dict[str, float]]:
    """Milliseconds of one forward over n tree tokens on top of ``context`` cached tokens (the
    measurement the adaptive budget calibrates with: engine/calibrate.py)."""
    from engine.calibrate import measure_verify_costs

    costs = measure_verify_costs(model, context, sizes, reps=None)
    base = costs[sizes[0]]
    return [{"n": n, "ms": round(ms, 2), "relative": round(ms / base, 3)} for n, ms in costs.items()]


def run_cost_curve(sessions: dict[str, Any], options: BenchOptions) -> int:
    """Time one target forward over n new tokens (a tree mask) on top of ~context cached tokens,
    for each --weights mode (and transformers with --peers hf)."""
    from rich.console import Console
    from rich.table import Table

    from specchat.bench_report import BENCH_JSON, machine_info, variant_words

    first = next(iter(sessions.values()))
    room = first.context_limit - max(SIZES)
    if options.context > room:  # positions past the context: a curve of a model running where it never trained
        raise UsageError(f"bench --cost-curve: --context {options.context} and a tree of {max(SIZES)} tokens do not "
                         f"fit the model's context of {first.context_limit} tokens; "
                         f"use --context {max(room, 0)} or less")
    curves = {f"specchat {w}": measure_cost_curve(s.model, options.context) for w, s in sessions.items()}
    if "hf" in [p.strip() for p in options.peers.split(",")]:
        from engine.models.hf import HFModel
        from engine.models.resolve import resolve_model

        path = resolve_model(options.target.model, revision=options.target.revision, weights="fp32").path
        curves["transformers"] = measure_cost_curve(HFModel.from_pretrained(path), options.context)
    machine = machine_info(first.model)
    variant = f", {variant_words(machine)} kernels" if machine.get("kernel_variant") else ""
    title = f"one target forward over n tree tokens, {options.context} cached ({first.model_name}{variant})"
    table = Table(title=title)
    table.add_column("n", justify="right")
    for name in curves:
        table.add_column(f"{name} ms", justify="right")
        table.add_column(f"{name} x n=1", justify="right")
    for i, row in enumerate(next(iter(curves.values()))):
        cells = [str(row["n"])]
        for curve in curves.values():
            cells += [f"{curve[i]['ms']:.1f}", f"{curve[i]['relative']:.2f}"]
        table.add_row(*cells)
    Console().print(table)
    if options.plot:
        from specchat.bench_plot import write_cost_svg

        print(f"bench: wrote {write_cost_svg(options.plot, table, curves, first.model_name)}")
    if options.json_out:
        BENCH_JSON.write_json(options.json_out, {"machine": machine, "model": first.model_name,
                                                 "context": options.context, "cost_curve": curves})
    return 0
