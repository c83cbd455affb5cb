"""``specchat bench --random-weights SHAPE``: the GPU numbers that depend on shapes, not weights.

Builds a randomly initialised model from a config (a bundled shape such as ``llama-3.1-8b`` or a
config.json), then measures in one process: greedy baseline decode time per token and its
fraction of the memory-bandwidth limit, the verify cost curve up to 64 tree tokens, and an oracle
check: the baseline's own continuation verified as draft chains must be accepted in full, unless
the verify forward is not batch-invariant (then the rate says how often a near-tie flipped).
Runs on a CPU too (that is how the tests check it), where the numbers describe the CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_greedy(model, cache, prompt: list[int], new_tokens: int) -> tuple[list[int], float]:
    """Plain greedy decoding from ``prompt`` (cache emptied first). Returns (tokens, ms per token
    after the first), each step ending in the one host read of the argmax, as the session's."""
    cache.truncate(0)
    out = model.forward(torch.tensor(prompt), cache, logits="last")
    cache.commit(len(prompt))
    tokens = [int(out.logits[-1].argmax())]
    _sync(model.device)
    t0 = time.perf_counter()
    for _ in range(new_tokens - 1):
        out = model.forward(torch.tensor(tokens[-1:]), cache)
        cache.commit(1)
        tokens.append(int(out.logits[0].argmax()))
    _sync(model.device)
    return tokens, (time.perf_counter() - t0) * 1e3 / max(1, new_tokens - 1)


def oracle_acceptance(model, cache, prompt: list[int], tokens: list[int], chain: int) -> dict[str, float]:
    """Verify the baseline's continuation as draft chains of ``chain`` tokens (root + chain-1
    drafts) on top of the cache the baseline filled; the fraction of drafts accepted greedily."""
    offered = accepted = 0
    # last chunk first: each only shortens the cache, whose lower slots the baseline filled
    for start in reversed(range(0, len(tokens) - chain, chain)):
        cache.truncate(len(prompt) + start)  # the prompt and tokens[:start]; tokens[start] is the root
        logits = model.forward(torch.tensor(tokens[start : start + chain]), cache).logits
        predicted = logits.argmax(-1).tolist()
        want = tokens[start + 1 : start + chain + 1]
        run = 0
        while run < chain - 1 and predicted[run] == want[run]:
            run += 1
        offered += chain - 1
        accepted += run
    return {"chain": chain, "offered": offered, "accepted": accepted,
            "rate": round(accepted / offered, 4) if offered else 1.0}


def synthetic_report(model, *, context: int, new_tokens: int, peak_gbps: float | None, chain: int = 8,
                     sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> dict[str, Any]:
    from engine.gpu.bandwidth import bandwidth_report, weight_bytes_per_token
    from specchat.bench import measure_cost_curve

    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.vocab_size, (context,), generator=gen).tolist()
    cache = model.new_cache(context + new_tokens + max(sizes) + 8)
    decode_greedy(model, cache, prompt, min(8, new_tokens))  # warm-up: kernels built, graphs captured
    tokens, ms = decode_greedy(model, cache, prompt, new_tokens)
    again, _ = decode_greedy(model, cache, prompt, new_tokens)
    oracle = oracle_acceptance(model, cache, prompt, tokens, chain)
    static = getattr(model, "_static", None)
    return {
        "baseline": {"tokens_per_s": round(1e3 / ms, 2), "ms_per_token": round(ms, 3), "tokens": new_tokens,
                     "deterministic": again == tokens},
        "bandwidth": bandwidth_report(weight_bytes_per_token(model), ms, peak_gbps),
        "cost_curve": measure_cost_curve(model, context, sizes),
        "oracle": oracle,
        "cuda_graphs": {"captures": static.captures, "replays": static.replays} if static is not None else None,
    }


def run_random_bench(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from engine.gpu.bandwidth import peak_bandwidth_gbps
    from engine.loader import configure_threads, pick_device, pick_dtype
    from engine.models.random_init import random_model
    from specchat.bench import machine_info

    configure_threads(args.threads)
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, device)
    name, model = random_model(args.random_weights, dtype=dtype, device=device)
    machine = machine_info(model)
    peak = args.peak_bandwidth or (peak_bandwidth_gbps(machine["gpu"]) if device.type == "cuda" else None)
    new_tokens = args.max_new_tokens or 128
    report = synthetic_report(model, context=args.context, new_tokens=new_tokens, peak_gbps=peak)
    report = {"machine": machine, "model": f"{name} (random weights)", "dtype": str(dtype).replace("torch.", ""),
              "device": str(device), "context": args.context, **report}

    console = Console()
    where = machine.get("gpu") or machine["cpu"]
    b, bw = report["baseline"], report["bandwidth"]
    table = Table(title=f"{report['model']}, {report['dtype']} on {where}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("baseline decode tok/s", f"{b['tokens_per_s']:.1f}")
    table.add_row("ms per token", f"{b['ms_per_token']:.2f}")
    gb = bw["weight_gb"]
    table.add_row("weights read per token", f"{gb:.2f} GB" if gb >= 1 else f"{gb * 1e3:.1f} MB")
    table.add_row("weights streamed", f"{bw['achieved_gbps']:.1f} GB/s")
    if bw["fraction_of_limit"] is not None:
        table.add_row("peak bandwidth", f"{bw['peak_gbps']:.0f} GB/s")
        table.add_row("bandwidth limit tok/s", f"{bw['limit_tokens_per_s']:.1f}")
        table.add_row("fraction of the limit", f"{bw['fraction_of_limit']:.1%}")
    else:
        table.add_row("fraction of the limit", "- (pass --peak-bandwidth GBPS)")
    curve = report["cost_curve"]
    table.add_row("verify(64) / verify(1)" if curve[-1]["n"] == 64 else "verify(max) / verify(1)",
                  f"{curve[-1]['relative']:.2f}")
    o = report["oracle"]
    table.add_row(f"oracle chains of {o['chain']} accepted", f"{o['accepted']}/{o['offered']} ({o['rate']:.1%})")
    table.add_row("greedy decode repeatable", "yes" if b["deterministic"] else "NO")
    console.print(table)
    costs = Table(title=f"one verify forward over n tree tokens, {args.context} cached")
    for col in ("n", "ms", "x n=1"):
        costs.add_column(col, justify="right")
    for row in curve:
        costs.add_row(str(row["n"]), f"{row['ms']:.2f}", f"{row['relative']:.2f}")
    console.print(costs)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0
