"""``specchat bench --data-engine N`` and ``--train-speed``: the draft-training paths, timed in one run.

Why a benchmark and not a log line: the speed-ups of the data engine (many conversations per
forward, the fast precision) and of training from stored features are claims against the paths
they replace, so both sides run here, in one process, on the same machine, one after the other:

* data: answer tokens/s of the one-conversation-at-a-time generator (exact precision, today's
  path before the rows engine) against the rows engine in exact and in fast precision, each
  generating at least N answer tokens into a fresh temporary cache with the same recipe;
* training: answer tokens/s of one optimizer step with the target run on every batch
  (transformers, fp32, today's path) against stored features in fp32 and under bf16 autocast,
  on the same batches of freshly generated data.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specchat.command_options import BenchOptions
from specchat.options import UsageError

TRAIN_BENCH_TOKENS = 12_000  # answer tokens generated for the training benchmark's batches


def run_data_bench(options: BenchOptions) -> int:
    import torch

    from engine.train.data import DataCache, GenSettings, answer_tokens, generate_data
    from engine.train.data_engine import generate_data_rows
    from specchat.bench_report import machine_info

    budget = int(options.data_engine)
    if budget <= 0:
        raise UsageError("--data-engine takes a positive number of answer tokens per path")
    target, model, prompts, capture = _rows_target(options)
    paths: list[tuple[str, str, int]] = [("one row", "exact", 1), ("rows", "exact", options.rows)]
    if model.fast_available:
        paths.append(("rows", "fast", options.rows))
    results = []
    for name, precision, rows in paths:
        model.precision = precision
        folder = Path(tempfile.mkdtemp(prefix="specchat-data-bench-"))
        cache = DataCache(folder, model.vocab_size)
        t0 = time.perf_counter()
        if rows == 1:
            samples = generate_data(model, target.tokenizer, cache, token_budget=budget, settings=GenSettings(),
                                    prompt_list=prompts)
        else:
            samples = generate_data_rows(model, target.tokenizer, cache, token_budget=budget, settings=GenSettings(),
                                         capture_layers=capture, prompt_list=prompts, rows=rows)
        seconds = time.perf_counter() - t0
        answer = answer_tokens(samples)
        results.append({"path": name, "precision": precision, "rows": rows, "answer_tokens": answer,
                        "conversations": len(samples), "seconds": round(seconds, 2),
                        "answer_tokens_per_s": round(answer / seconds, 2),
                        "features_stored": rows > 1})
        print(f"{name:7s} {precision:5s} rows={rows:3d}: {answer} answer tokens in {seconds:.1f} s = "
              f"{answer / seconds:.1f} tok/s", flush=True)
    model.precision = "exact"
    _speedups(results, "one row", lambda r: f"{r['path']} {r['precision']}")
    _write(options, {"machine": machine_info(model), "benchmark": "data engine", "threads": torch.get_num_threads(),
                  "results": results})
    return 0


def run_train_bench(options: BenchOptions) -> int:
    import torch

    from engine.train.data import DataCache, GenSettings, iter_batches
    from engine.train.data_engine import generate_data_rows
    from engine.train.targets import LiveTarget, StoredTarget
    from engine.train.trainer import TrainSettings, batch_loss, build_head
    from specchat.bench_report import machine_info

    target, model, prompts, capture = _rows_target(options)
    cache = DataCache(Path(tempfile.mkdtemp(prefix="specchat-train-bench-")), model.vocab_size)
    samples = generate_data_rows(model, target.tokenizer, cache, token_budget=TRAIN_BENCH_TOKENS,
                                 settings=GenSettings(seed=7), capture_layers=capture, prompt_list=prompts,
                                 rows=options.rows)
    settings = TrainSettings(batch_tokens=1024)
    head = build_head(target.hf, samples, settings, sorted(target.tokenizer.stop_token_ids))
    opt = torch.optim.AdamW(head.parameters(), lr=1e-5)
    batches = list(iter_batches(samples, settings.batch_tokens, random.Random(0)))[:10]
    paths = [("target run per batch", LiveTarget(target.hf), False),
             ("stored features", StoredTarget(cache, target.hf), False),
             ("stored features, bf16 autocast", StoredTarget(cache, target.hf), True)]
    results = []
    for name, source, bf16 in paths:
        tokens, seconds = 0, 0.0
        for i, batch in enumerate(batches):
            t0 = time.perf_counter()
            loss, stats, *_ = batch_loss(head, source, batch, settings.ttt_steps, settings.step_weight, bf16=bf16)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if i >= 2:  # the first batches warm allocators and caches
                seconds += time.perf_counter() - t0
                tokens += stats.tokens
        results.append({"path": name, "bf16": bf16, "answer_tokens": tokens, "seconds": round(seconds, 2),
                        "answer_tokens_per_s": round(tokens / seconds, 2)})
        print(f"{name:32s}: {tokens / seconds:.1f} answer tok/s", flush=True)
    _speedups(results, "the target run per batch", lambda r: r["path"])
    _write(options, {"machine": machine_info(model), "benchmark": "training", "ttt_steps": settings.ttt_steps,
                  "batch_tokens": settings.batch_tokens, "threads": torch.get_num_threads(), "results": results})
    return 0


def _rows_target(options: BenchOptions) -> tuple[Any, Any, list, list[int]]:
    """The target (threads set), our engine's model (refused without the rows engine), the prompt
    list and the EAGLE-3 capture layers: what both benchmarks generate data with."""
    from engine.loader import configure_threads
    from engine.train.eagle3_head import default_aux_layer_ids
    from engine.train.pipeline import load_target, prompt_list_and_digest
    from specchat.preflight import check_capture_layers

    check_capture_layers(options.target.model)  # a target too shallow to capture from, before the load
    configure_threads(options.target.threads)
    target = load_target(options.target.model)
    model = target.engine
    if model is None or not model.runs_rows:
        raise UsageError("the data engine runs on our native CPU decoder; this model or machine has none")
    prompts, _ = prompt_list_and_digest(None)
    return target, model, prompts, [i + 1 for i in default_aux_layer_ids(model.num_layers)]


def _speedups(results: list[dict[str, Any]], base_name: str, label: Callable[[dict[str, Any]], str]) -> None:
    """Each result's rate against the first one, stored and printed."""
    base = results[0]["answer_tokens_per_s"]
    for r in results:
        r["speedup"] = round(r["answer_tokens_per_s"] / base, 2)
    print(f"speed-up against {base_name}: " + ", ".join(f"{label(r)} {r['speedup']:.2f}x" for r in results[1:]))


def _write(options: BenchOptions, report: dict[str, Any]) -> None:
    from specchat.bench_report import BENCH_JSON

    if options.json_out:
        BENCH_JSON.write_json(options.json_out, report)
