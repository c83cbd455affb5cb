"""``specchat bench --random-weights SHAPE``: the GPU numbers that depend on shapes, not weights.

Builds a randomly initialised model from a config (a bundled shape such as ``llama-3.1-8b`` or a
config.json), then measures in one process: greedy baseline decode time per token and its
fraction of the memory-bandwidth limit, the verify cost curve up to 64 tree tokens, and an oracle
check: the baseline's own continuation verified as draft chains must be accepted in full, unless
the verify forward is not batch-invariant (then the rate says how often a near-tie flipped).

With ``--methods none,eagle3`` (or ``--method eagle3``, or ``--draft HEAD``) it also times an
EAGLE head drafting on that target: a randomly initialised EAGLE-3 head shaped for it (written in
the public layout and loaded through the normal drafter path, so the timed code is the one a real
head runs), or the head given with ``--draft``. A random head's drafts are never accepted, so the
number is the cost: milliseconds per draft level, for a chain (topk 1) and for the default tree,
and that cost as a fraction of one baseline token. Methods it cannot measure on random weights
(ngram, standalone) are refused before anything is built, never silently skipped.

Runs on a CPU too (that is how the tests check it), where the numbers describe the CPU.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from engine.calibrate import sync
from specchat.bench_cost import measure_cost_curve
from specchat.command_options import BenchOptions

# Public EAGLE-3 heads for large-vocabulary targets (Llama-3.1-8B: 128256) draft over 32000 ids;
# a random head takes the same size (or the whole vocabulary of a smaller target).
DRAFT_VOCAB = 32000
DRAFT_WARMUP_STEPS = 3  # untimed proposes per tree shape: kernels built, caches sized
DRAFT_TIMED_STEPS = 20


def decode_greedy(model, cache, prompt: list[int], new_tokens: int) -> tuple[list[int], float]:
    """Plain greedy decoding from ``prompt`` (cache emptied first). Returns (tokens, ms per token
    after the first), each step ending in the one host read of the argmax, as the session's."""
    cache.truncate(0)
    out = model.forward(torch.tensor(prompt), cache, logits="last")
    cache.commit(len(prompt))
    tokens = [int(out.logits[-1].argmax())]
    sync(model)
    t0 = time.perf_counter()
    for _ in range(new_tokens - 1):
        out = model.forward(torch.tensor(tokens[-1:]), cache)
        cache.commit(1)
        tokens.append(int(out.logits[0].argmax()))
    sync(model)
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

    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.vocab_size, (context,), generator=gen).tolist()
    cache = model.new_cache(context + new_tokens + max(sizes) + 8)
    decode_greedy(model, cache, prompt, min(8, new_tokens))  # warm-up: kernels built, graphs captured
    tokens, ms = decode_greedy(model, cache, prompt, new_tokens)
    again, _ = decode_greedy(model, cache, prompt, new_tokens)
    oracle = oracle_acceptance(model, cache, prompt, tokens, chain)
    graphs = model.graph_counts
    return {
        "baseline": {"tokens_per_s": round(1e3 / ms, 2), "ms_per_token": round(ms, 3), "tokens": new_tokens,
                     "deterministic": again == tokens},
        "bandwidth": bandwidth_report(weight_bytes_per_token(model), ms, peak_gbps),
        "cost_curve": measure_cost_curve(model, context, sizes),
        "oracle": oracle,
        "cuda_graphs": {"captures": graphs.captures, "replays": graphs.replays} if graphs is not None else None,
    }


# -- drafting cost ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class RandomPlan:
    """What a --random-weights run measures, settled from the flags alone (before any model is
    built, so a combination it cannot measure is refused at once)."""

    method: str | None  # "eagle3" / "eagle" to time drafting; None with a --draft: inferred from the head
    draft: str | None  # --draft PATH; None with a method: a random EAGLE-3 head shaped for the target

    @property
    def drafting(self) -> bool:
        return self.method is not None or self.draft is not None


def plan_random_bench(options: BenchOptions, target_config: dict[str, Any]) -> RandomPlan:
    """Check the flags that --random-weights cannot honour and say which drafter to time.

    Raises UsageError (one line) for: flags that need a real checkpoint (--prompts, --peers,
    --data-engine, --train-speed), sampling (the run decodes greedily), ngram (its drafts are
    looked up in the text, and random weights write no text worth matching), standalone (a draft
    model must share the target's tokenizer; a random target has none), EAGLE-1/2 without a
    --draft head (only EAGLE-3 heads are built at random), two heads at once, a --draft that no
    listed method would use, and a random EAGLE-3 head for a target of fewer than 5 layers.
    """
    from specchat.options import ALGORITHMS, UsageError

    needs_checkpoint = [flag for flag, given in (
        ("--prompts", options.prompts), ("--peers", options.peers.strip()),
        ("--data-engine", options.data_engine is not None), ("--train-speed", options.train_speed)) if given]
    if needs_checkpoint:
        verb = "needs" if len(needs_checkpoint) == 1 else "need"
        raise UsageError(f"--random-weights runs synthetic measurements only; {', '.join(needs_checkpoint)} {verb} "
                         "a real checkpoint (drop --random-weights)")
    spec = options.spec
    if (spec.knob("temperature") or 0) > 0:
        raise UsageError("--random-weights decodes greedily; drop --temperature")
    listed = [m.strip() for m in (options.methods or "").split(",") if m.strip()]
    if spec.knob("method"):
        listed.append(spec.knob("method"))
    names = []
    for m in listed:
        if m.lower() not in ALGORITHMS:
            raise UsageError(f"unknown method {m!r}; --random-weights measures none and eagle3 (or eagle with --draft)")
        names.append(ALGORITHMS[m.lower()])
    asked = sorted({m for m in names if m != "none"})
    from engine import methods

    for m in methods.all_methods():  # each registration says why random weights cannot time it
        if m.name in asked and m.random_weights:
            raise UsageError(f"--random-weights cannot measure {m.name}: {m.random_weights}")
    if len(asked) > 1:
        raise UsageError(f"--random-weights times one EAGLE head per run, not {' and '.join(asked)}")
    method = asked[0] if asked else None
    draft = spec.draft
    if draft is None:
        if method == "eagle":
            raise UsageError("--random-weights builds EAGLE-3 heads only; give an EAGLE-1/2 head with --draft PATH")
        if spec.token_map:
            raise UsageError("--speculative-token-map restricts an EAGLE-1/2 head; give one with --draft PATH")
        layers = int(target_config.get("num_hidden_layers") or 0)
        if method == "eagle3" and layers < 5:
            raise UsageError(f"an EAGLE-3 head reads 3 target layers (at least 5 needed); this shape has {layers}")
    elif method is None and listed:
        raise UsageError(f"--draft {draft} is timed by an EAGLE method; list it: --methods none,eagle3 (or eagle)")
    return RandomPlan(method, draft)


def write_random_eagle3_head(target_config: dict[str, Any], folder: str | Path, *, dtype: torch.dtype,
                             seed: int = 0) -> Path:
    """A randomly initialised EAGLE-3 head shaped for ``target_config`` (a config.json dict), written
    in the public layout (config.json + model.safetensors): width, attention shape and MLP of the
    target, 3 aux layers at EAGLE-3's defaults, a draft vocabulary of min(32000, vocab) ids.

    Written and read back rather than used in memory so the timed drafter is exactly what a
    downloaded head becomes (the same loader, validation and kernels)."""
    from engine.train.eagle3_head import Eagle3Head, HeadConfig, export_head

    vocab = int(target_config["vocab_size"])
    cfg = HeadConfig.for_target(SimpleNamespace(**target_config), draft_vocab_size=min(DRAFT_VOCAB, vocab))
    with torch.random.fork_rng(devices=[]):  # the caller's random stream stays as it was
        torch.manual_seed(seed)
        head = Eagle3Head(cfg, torch.arange(cfg.draft_vocab_size))
    out_dtype = dtype if dtype in (torch.float32, torch.float16) else torch.bfloat16
    return export_head(head, folder, dtype=out_dtype, card={"random": True, "seed": seed})


def load_random_bench_draft(plan: RandomPlan, model, target_config: dict[str, Any], options: BenchOptions):
    """The DraftBundle to time: the --draft head, else a random EAGLE-3 head (built in a temporary
    folder, loaded, and the folder removed: the loaded head holds its own copy of the weights)."""
    from engine.drafters.draft_loader import load_draft

    if plan.draft is not None:
        return load_draft(plan.draft, model, None, method=plan.method,
                          allow_pickle=options.target.allow_pickle,
                          revision=options.spec.draft_revision, token_map=options.spec.token_map)
    with tempfile.TemporaryDirectory(prefix="specchat-random-head-") as tmp:
        folder = write_random_eagle3_head(target_config, Path(tmp) / "eagle3-random", dtype=model.dtype)
        bundle = load_draft(str(folder), model, None, method="eagle3")
    bundle.description = f"random EAGLE-3 head ({min(DRAFT_VOCAB, int(target_config['vocab_size']))} draft tokens)"
    return bundle


def time_drafting(model, bundle, config, *, context: int, warmup: int = DRAFT_WARMUP_STEPS,
                  steps: int = DRAFT_TIMED_STEPS) -> dict[str, Any]:
    """Milliseconds one draft step and one draft level take with ``config``'s tree shape.

    The drafter starts from ``context`` random tokens with the target's real features for them,
    then runs ``warmup`` untimed and ``steps`` timed proposes; between proposes one token is
    committed (what a step that accepts nothing does), so each step extends the head's cache by
    one entry and grows ``num_steps`` levels (the first from that entry: one head forward per
    level). The device is synchronised before each clock read. The adaptive stop rule is off:
    every level is grown, so the per-level cost is not blurred by a confidence guess.
    """
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.vocab_size, (context,), generator=gen).tolist()
    cache = model.new_cache(context + 8)
    out = model.forward(torch.tensor(prompt), cache, logits="last", **bundle.features.forward_kwargs())
    features = bundle.features.extract(out)
    drafter = bundle.factory()
    drafter.reset(prompt, features)
    history = list(prompt)
    root = int(out.logits[-1].argmax())
    times: list[float] = []
    for i in range(warmup + steps):
        sync(model)
        t0 = time.perf_counter()
        tree = drafter.propose(history, root, config)
        sync(model)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
        drafter.observe([root], features[-1:])  # the root committed, no draft accepted
        history.append(root)
        root = tree.tokens[1] if len(tree.tokens) > 1 else root
    step_ms = sorted(times)[len(times) // 2]  # the median resists a stray slow step
    return {"topk": config.eagle_topk, "num_steps": config.num_steps, "num_draft_tokens": config.num_draft_tokens,
            "ms_per_step": round(step_ms, 4), "ms_per_level": round(step_ms / config.num_steps, 4)}


def drafting_report(model, bundle, tree_config, *, context: int, baseline_ms: float,
                    warmup: int = DRAFT_WARMUP_STEPS, steps: int = DRAFT_TIMED_STEPS) -> dict[str, Any]:
    """Draft cost of ``bundle``'s head for a chain (topk 1, num_steps levels) and for the tree
    ``tree_config`` describes, each also as a fraction of one baseline token (``baseline_ms``):
    what a level must earn in accepted tokens to pay for itself."""
    from engine.methods import chain_size

    chain = tree_config.replace(eagle_topk=1, num_draft_tokens=chain_size(tree_config.num_steps))
    out: dict[str, Any] = {"method": bundle.method, "head": bundle.description, "context": context}
    for name, cfg in (("chain", chain), ("tree", tree_config)):
        row = time_drafting(model, bundle, cfg, context=context, warmup=warmup, steps=steps)
        row["level_vs_token"] = round(row["ms_per_level"] / baseline_ms, 4) if baseline_ms else None
        out[name] = row
    return out


def run_random_bench(options: BenchOptions) -> int:
    from rich.console import Console
    from rich.table import Table

    from engine.gpu.bandwidth import peak_bandwidth_gbps
    from engine.loader import configure_threads, pick_device, pick_dtype
    from engine.models.random_init import random_config, random_model
    from specchat.bench_report import BENCH_JSON, linear_words, machine_info
    from specchat.options import given_knobs, make_config

    shape, target = str(options.random_weights), options.target
    _, target_config = random_config(shape)
    plan = plan_random_bench(options, target_config)
    tree_config = make_config(options.spec, method="none") if plan.drafting else None
    configure_threads(target.threads)
    device = pick_device(target.device)
    dtype = pick_dtype(target.dtype, device)
    name, model = random_model(shape, dtype=dtype, device=device)
    bundle = load_random_bench_draft(plan, model, target_config, options) if plan.drafting else None
    machine = machine_info(model)
    peak = options.peak_bandwidth or (peak_bandwidth_gbps(machine["gpu"]) if device.type == "cuda" else None)
    new_tokens = options.spec.knob("max_new_tokens") or 128
    report = synthetic_report(model, context=options.context, new_tokens=new_tokens, peak_gbps=peak)
    report = {"machine": machine, "model": f"{name} (random weights)", "dtype": str(dtype).replace("torch.", ""),
              "device": str(device), "context": options.context,
              "methods": ["none"] + ([bundle.method] if bundle is not None else []), **report}
    if bundle is not None:
        tree_config = tree_config.with_method(bundle.method, given_knobs(options.spec))
        report["drafting"] = drafting_report(model, bundle, tree_config, context=options.context,
                                             baseline_ms=report["baseline"]["ms_per_token"])

    console = Console()
    where = machine.get("gpu") or machine["cpu"]
    b, bw = report["baseline"], report["bandwidth"]
    table = Table(title=f"{report['model']}, {report['dtype']}{linear_words(machine)} on {where}")
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
    drafting = report.get("drafting")
    if drafting is not None:
        for shape in ("chain", "tree"):
            d = drafting[shape]
            table.add_row(f"{drafting['method']} draft level, {shape} (topk {d['topk']})",
                          f"{d['ms_per_level']:.3f} ms = {d['level_vs_token']:.3f} x token")
    console.print(table)
    costs = Table(title=f"one verify forward over n tree tokens, {options.context} cached")
    for col in ("n", "ms", "x n=1"):
        costs.add_column(col, justify="right")
    for row in curve:
        costs.add_row(str(row["n"]), f"{row['ms']:.2f}", f"{row['relative']:.2f}")
    console.print(costs)
    if drafting is not None:
        draft_table = Table(title=f"drafting cost: {drafting['head']}, {options.context} cached "
                                  "(random heads accept nothing: this is the cost side)")
        for col in ("tree", "topk", "levels", "ms per step", "ms per level", "level / baseline token"):
            draft_table.add_column(col, justify="left" if col == "tree" else "right")
        for shape in ("chain", "tree"):
            d = drafting[shape]
            draft_table.add_row(shape, str(d["topk"]), str(d["num_steps"]), f"{d['ms_per_step']:.3f}",
                                f"{d['ms_per_level']:.3f}", f"{d['level_vs_token']:.3f}")
        console.print(draft_table)
    if options.json_out:
        BENCH_JSON.write_json(options.json_out, report)
    return 0
