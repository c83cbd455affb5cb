"""``specchat bench --cost-curve``: what one target forward costs over n tree tokens, relative to n = 1.

Why: speculation pays only while verifying n tokens costs much less than n forwards of one, so
this curve decides how big a draft tree is worth verifying on a machine. ``gpu_bench`` measures
the same curve on a random model of any shape.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def sync(model: Any) -> None:
    """Wait for the GPU, so a timing covers the work and not only its launch."""
    import torch

    device = getattr(model, "device", None)
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure_cost_curve(model: Any, context: int, sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
                       ) -> list[dict[str, float]]:
    """Milliseconds of one forward over n tree tokens on top of ``context`` cached tokens."""
    import torch

    from engine.tree import DraftTree

    cache = model.new_cache(context + max(sizes) + 8)
    gen = torch.Generator().manual_seed(0)
    model.forward(torch.randint(0, model.vocab_size, (context,), generator=gen), cache, logits="last")
    cache.commit(context)
    results: list[dict[str, float]] = []
    base_ms = None
    for n in sizes:
        # a binary-ish tree: node i's parent is (i-1)//2, the shape a top-2 drafter makes
        tree = DraftTree(tuple(range(n)), tuple([-1] + [(i - 1) // 2 for i in range(1, n)]), (1.0,) * n)
        tokens = torch.randint(0, model.vocab_size, (n,), generator=gen)
        positions = torch.tensor(tree.depths) + context
        mask = tree.ancestor_mask() if n > 1 else None
        for _ in range(2):
            model.forward(tokens, cache, positions=positions, tree_mask=mask)
        reps = max(3, int(24 / n))
        times = []
        for _ in range(reps):
            sync(model)
            t0 = time.perf_counter()
            model.forward(tokens, cache, positions=positions, tree_mask=mask)
            sync(model)
            times.append((time.perf_counter() - t0) * 1e3)
        ms = sorted(times)[len(times) // 2]  # the median resists a stray slow call
        base_ms = base_ms or ms
        results.append({"n": n, "ms": round(ms, 2), "relative": round(ms / base_ms, 3)})
    return results


def run_cost_curve(sessions: dict[str, Any], args: argparse.Namespace) -> int:
    """Time one target forward over n new tokens (a tree mask) on top of ~context cached tokens,
    for each --weights mode (and transformers with --peers hf)."""
    from rich.console import Console
    from rich.table import Table

    from specchat.bench_report import machine_info

    first = next(iter(sessions.values()))
    curves = {f"specchat {w}": measure_cost_curve(s.model, args.context) for w, s in sessions.items()}
    if "hf" in [p.strip() for p in args.peers.split(",")]:
        from engine.models.hf import HFModel
        from engine.models.resolve import resolve_model

        path = resolve_model(args.model, revision=args.revision, weights="fp32").path
        curves["transformers"] = measure_cost_curve(HFModel.from_pretrained(path), args.context)
    machine = machine_info(first.model)
    variant = f", {machine['kernel_variant']} kernels" if machine.get("kernel_variant") else ""
    table = Table(title=f"one target forward over n tree tokens, {args.context} cached ({first.model_name}{variant})")
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
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": machine, "model": first.model_name,
                                                   "context": args.context, "cost_curve": curves}, indent=2) + "\n")
    return 0
