"""``specchat bench``: every method on every prompt, one process, one model load, same run.

Speedups are ratios of tokens/s measured in this run against the ``none`` baseline, never
against a number from elsewhere. Runs are interleaved prompt by prompt (baseline, then each
method, then the peers) so background noise on the machine lands on every row alike, and each
run is timed alone. Tokens/s counts new tokens (a final stop token excluded) over wall time
from the request to the last token, prefill included, for every row; our own rows also report
decode tokens/s (after the prefill), the number the prefill of long prompts would otherwise blur.

Every runner answers once, untimed, before the timed runs. On CUDA the warm-up also sizes each
session's KV cache for the longest prompt and captures the verify forward's CUDA graph of every
tree-size bucket (engine/gpu/static.py captures one per bucket on first use, per cache address),
so neither a capture, a Triton compile nor a cache reallocation lands inside a timed prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import UserError
from specchat.cli import UsageError, draft_options, make_config


class PromptFileError(UserError, ValueError):
    """A prompt file line that is not a usable prompt; names the file and line."""


@dataclass
class Prompt:
    id: str
    messages: list[dict[str, str]] | None = None
    text: str | None = None  # raw text, no chat template


def load_prompts(path: str | Path, limit: int | None = None) -> list[Prompt]:
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"prompt file {path} does not exist")
    prompts: list[Prompt] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{where}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
        if not isinstance(row, dict):
            raise PromptFileError(f"{where}: expected a JSON object with 'messages', 'turns' or 'prompt'")
        pid = str(row.get("id", row.get("question_id", lineno)))
        if "messages" in row:
            msgs = row["messages"]
            if not (isinstance(msgs, list) and msgs and all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in msgs)):
                raise PromptFileError(f"{where}: 'messages' must be a list of {{role, content}} objects")
            prompts.append(Prompt(pid, messages=[{"role": m["role"], "content": m["content"]} for m in msgs]))
        elif "turns" in row:
            turns = row["turns"]
            if not (isinstance(turns, list) and turns and isinstance(turns[0], str)):
                raise PromptFileError(f"{where}: 'turns' must be a non-empty list of strings")
            prompts.append(Prompt(pid, messages=[{"role": "user", "content": turns[0]}]))
        elif "prompt" in row and isinstance(row["prompt"], str):
            prompts.append(Prompt(pid, text=row["prompt"]))
        else:
            raise PromptFileError(f"{where}: no 'messages', 'turns' or 'prompt' field")
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise PromptFileError(f"{path} holds no prompts")
    return prompts


_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi", "avx512_bf16", "avx_vnni",
          "amx_int8", "amx_bf16")  # the ones our kernels choose variants by


def machine_info(model: object | None = None) -> dict[str, Any]:
    """The machine, plus which compute path the model runs (our native CPU kernels or torch's)."""
    import torch

    cpu = platform.processor() or ""
    flags: list[str] = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not flags:
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = [f for f in line.split(":", 1)[1].split() if f in _FLAGS]
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cpu_flags": flags, "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "python": platform.python_version(), "platform": platform.platform()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    kernels = getattr(model, "kernels", None)
    if kernels:
        info["kernels"] = kernels
        from engine.kernels import native

        info["kernel_variant"] = native.variant() if kernels == "native" else "torch"
    return info


@dataclass
class StepSplit:
    """Where our steps' time went: drafting vs verifying, levels drafted (drafters that pay per
    level), steps with drafting paused by the adaptive budget."""

    steps: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    levels: int = 0
    paused: int = 0

    def add(self, step) -> None:
        self.steps += 1
        self.draft_ms += step.timing.draft_ms
        self.verify_ms += step.timing.verify_ms
        self.levels += step.draft_levels
        self.paused += int(step.draft_paused)

    def fields(self) -> dict[str, float | None]:
        n = self.steps
        return {
            "draft_ms_per_step": round(self.draft_ms / n, 3) if n else None,
            "verify_ms_per_step": round(self.verify_ms / n, 3) if n else None,
            "mean_draft_levels": round(self.levels / n, 3) if n else None,
            "paused_share": round(self.paused / n, 3) if n else None,
        }


@dataclass
class Row:
    name: str
    weights: str | None = None  # "stored" / "fp32" for our rows; None for peers
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    produced: int = 0
    prefill_seconds: float | None = 0.0  # None for peers, whose prefill is not reported apart
    identical: int = 0  # equal to the baseline of the same weights
    same_as_reference: int = 0  # equal to the baseline of the first --weights mode
    prompts: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    split: StepSplit = field(default_factory=StepSplit)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over the time after the prefill (ours only)."""
        if self.prefill_seconds is None or self.seconds <= self.prefill_seconds:
            return None
        return (self.tokens - self.prompts) / (self.seconds - self.prefill_seconds)

    @property
    def tau(self) -> float | None:
        return self.produced / self.steps if self.steps else None


def _run_ours(session, prompt: Prompt, config, split: StepSplit | None = None
              ) -> tuple[list[int], int, int, float, float]:
    from engine.events import Finished, Started, Step

    session.reset()
    t0 = time.perf_counter()
    if prompt.text is not None:
        events = session.generate_ids(session.tokenizer.encode(prompt.text), config)
    else:
        events = session.generate(prompt.messages, config)
    tokens: list[int] = []
    steps = produced = 0
    prefill_s = 0.0
    for event in events:
        if isinstance(event, Started):
            prefill_s = event.prefill_ms / 1e3
        elif isinstance(event, Step):
            tokens.extend(c.id for c in event.committed)
            steps += 1
            if split is not None:
                split.add(event)
        elif isinstance(event, Finished):
            seconds = time.perf_counter() - t0
            produced = event.tokens + (event.reason == "stop")  # tau counts a final stop token
    return tokens, steps, produced, seconds, prefill_s


class HFPeer:
    """transformers' own generate(): greedy, and its prompt-lookup decoding."""

    def __init__(self, path: str, session, max_new_tokens: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.session = session
        self.stops = sorted(session.tokenizer.stop_token_ids)
        self.max_new_tokens = max_new_tokens

    def run(self, prompt: Prompt, lookup: bool) -> tuple[list[int], int, int, float, None]:
        torch = self.torch
        tok = self.session.tokenizer
        ids = tok.encode(prompt.text) if prompt.text is not None else tok.encode_chat(prompt.messages)
        inputs = torch.tensor([ids])
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": False,
                                  "eos_token_id": self.stops, "pad_token_id": self.stops[0],
                                  "attention_mask": torch.ones_like(inputs)}
        if lookup:
            kwargs["prompt_lookup_num_tokens"] = 10
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(inputs, **kwargs)
        seconds = time.perf_counter() - t0
        new = out[0, len(ids):].tolist()
        produced = len(new)
        if new and new[-1] in self.stops:
            new = new[:-1]
        return new, 0, produced, seconds, None


def weights_modes(args: argparse.Namespace) -> list[str]:
    """``--weights stored,fp32`` x ``--precision exact,fast`` -> the modes to load, one session each:
    "stored", "fp32" (exact precision only), or "stored/exact", "stored/fast" (order kept,
    duplicates dropped). Each method is compared with the baseline of its own mode."""
    def listed(value: str | None, default: str) -> list[str]:
        return list(dict.fromkeys(v.strip() for v in (value or default).split(",") if v.strip()))

    weights = listed(getattr(args, "weights", None), "stored")
    bad = [w for w in weights if w not in ("stored", "fp32")]
    if bad or not weights:
        raise UsageError(f"--weights takes stored, fp32 or stored,fp32, not {args.weights!r}")
    precisions = listed(getattr(args, "precision", None), "auto")
    bad = [p for p in precisions if p not in ("auto", "exact", "fast")]
    if bad or not precisions:
        raise UsageError(f"--precision takes auto, exact, fast or exact,fast, not {args.precision!r}")
    if "auto" in precisions and len(precisions) > 1:
        raise UsageError("--precision auto stands alone; name them to compare (exact,fast)")
    if precisions == ["auto"]:  # fast where it runs, for a run of stored weights alone
        from engine.loader import LoadError, pick_device, pick_dtype, resolve_precision

        precisions = ["exact"]
        if weights == ["stored"]:
            try:
                device = pick_device(getattr(args, "device", None) or "auto")
                precisions = [resolve_precision("auto", device=device, backend=getattr(args, "backend", None) or "auto",
                                                dtype=pick_dtype(getattr(args, "dtype", None) or "auto", device))]
            except LoadError as exc:
                raise UsageError(str(exc)) from None
    if "fast" in precisions and "fp32" in weights:
        raise UsageError("--precision fast runs on stored weights only; drop fp32 from --weights")
    if precisions == ["exact"]:
        return weights
    return [f"{w}/{p}" for w in weights for p in precisions]


def mode_parts(mode: str) -> tuple[str, str]:
    """"stored/fast" -> ("stored", "fast"); "fp32" -> ("fp32", "exact")."""
    weights, _, precision = mode.partition("/")
    return weights, precision or "exact"


def _load_sessions(args: argparse.Namespace, base_config, modes: list[str]) -> dict[str, Any]:
    from engine.loader import load_session
    from engine.models.progress import rich_progress

    sessions = {}
    with rich_progress() as progress:
        for mode in modes:
            weights, precision = mode_parts(mode)
            sessions[mode] = load_session(args.model, base_config, dtype=args.dtype, device=args.device,
                                          backend=args.backend, allow_pickle=args.allow_pickle, progress=progress,
                                          threads=args.threads, revision=args.revision, weights=weights,
                                          precision=precision, **draft_options(args))
    return sessions


def prepare_json_out(path: str | None) -> None:
    """Make sure ``--json PATH`` can be written, before any model loads: create its parent folder
    (``--json bench-out/x.json`` on a fresh machine) or refuse in one line, rather than ending a
    run of minutes in a FileNotFoundError with the results lost."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"--json {path} is a folder; name a file in it")
    parent = target.parent
    blocker = next((p for p in (parent, *parent.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise UsageError(f"--json {path}: {blocker} is a file, not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--json {path}: cannot create the folder {parent} ({exc.strerror or exc})") from None
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--json {path}: the folder {parent} is not writable")


def run_bench(args: argparse.Namespace) -> int:
    if getattr(args, "random_weights", None):
        from specchat.gpu_bench import run_random_bench

        return run_random_bench(args)  # checks its flags, then --json, before building the model
    if getattr(args, "data_engine", None) is not None or getattr(args, "train_speed", False):
        from specchat.bench_train import run_data_bench, run_train_bench

        prepare_json_out(args.json_out)
        return run_data_bench(args) if args.data_engine is not None else run_train_bench(args)
    base_config = make_config(args, method="none", max_new_tokens=256)
    modes = weights_modes(args)
    if args.cost_curve:
        prepare_json_out(args.json_out)
        return run_cost_curve(_load_sessions(args, base_config, modes), args)
    if not args.prompts:
        raise UsageError("bench needs --prompts FILE.jsonl (or --cost-curve)")
    prompts = load_prompts(args.prompts, args.limit)
    if not base_config.greedy and base_config.sampling == "coupled" and base_config.seed is None:
        base_config = base_config.replace(seed=0)  # coupled samples are a function of the seed: fix one
    methods = [m.strip() for m in (args.methods or "none,ngram").split(",") if m.strip()]
    methods = ["none"] + [m for m in methods if m != "none"]
    configs = {m: base_config.replace(method=m) for m in methods}
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for peer in peers:
        if peer not in ("hf", "llamacpp"):
            raise UsageError(f"unknown peer {peer!r}; available: hf, llamacpp")
    prepare_json_out(args.json_out)
    llama_peer = None
    if "llamacpp" in peers:
        from specchat.llamacpp_peer import LlamaCppPeer

        llama_peer = LlamaCppPeer.open(args.model, base_config.max_new_tokens, args.threads)
    if not base_config.greedy and base_config.sampling == "coupled":
        print(f"bench: temperature > 0, coupled sampling with seed {base_config.seed}: every method must give "
              "the baseline's sample")
    elif not base_config.greedy:
        print("bench: temperature > 0 with rejection sampling: outputs differ from the baseline's by design")

    sessions = _load_sessions(args, base_config, modes)
    first = sessions[modes[0]]
    hf = None
    if "hf" in peers:
        from engine.models.resolve import resolve_model

        hf_path = resolve_model(args.model, revision=args.revision, weights="fp32").path
        hf = HFPeer(hf_path, first, base_config.max_new_tokens)
    for m in methods:  # fail fast on an unavailable method, before any timing
        first._check_available(configs[m])

    multi = len(modes) > 1
    rows: dict[str, Row] = {}
    for w in modes:
        for m in methods:
            rows[f"{m} [{w}]" if multi else m] = Row(m, w)
    if hf:
        rows["hf-generate"] = Row("hf-generate")
        rows["hf-prompt-lookup"] = Row("hf-prompt-lookup")
    if llama_peer:
        rows["llamacpp"] = Row("llamacpp")
        rows["llamacpp-prompt-lookup"] = Row("llamacpp-prompt-lookup")
    # warm-up: one short answer per runner, untimed
    for w in modes:  # CUDA: a KV cache that grows mid-bench moves, and its graphs are captured again
        size_cache_for(sessions[w], prompts, configs.values())
    warm = configs["none"].replace(max_new_tokens=8)
    for w in modes:
        for m in methods:
            _run_ours(sessions[w], prompts[0], warm.replace(method=m))
    graphs = {w: capture_verify_graphs(sessions[w]) for w in modes}  # CUDA: every bucket, not just those used
    if hf:
        saved, hf.max_new_tokens = hf.max_new_tokens, 8
        hf.run(prompts[0], False)
        hf.run(prompts[0], True)
        hf.max_new_tokens = saved
    if llama_peer:
        llama_peer.warm(first, prompts[0])

    from rich.progress import Progress

    total = len(prompts) * len(rows)
    # no auto-refresh thread: a thread waking 10 times a second steals a core from the model
    with Progress(transient=True, auto_refresh=False) as bar:
        task = bar.add_task("benchmarking", total=total)
        for prompt in prompts:
            baselines: dict[str | None, list[int]] = {}
            for name, row in rows.items():
                bar.update(task, description=f"{prompt.id}: {name}")
                if row.weights is not None:
                    tokens, steps, produced, seconds, prefill = _run_ours(sessions[row.weights], prompt,
                                                                          configs[row.name], row.split)
                elif row.name.startswith("llamacpp"):
                    tokens, steps, produced, seconds, prefill = llama_peer.run(
                        first, prompt, lookup=row.name.endswith("lookup"))
                else:
                    tokens, steps, produced, seconds, prefill = hf.run(prompt, lookup=name == "hf-prompt-lookup")
                row.prefill_seconds = None if prefill is None or row.prefill_seconds is None else (
                    row.prefill_seconds + prefill)
                if row.name == "none" and row.weights is not None:
                    baselines[row.weights] = tokens
                    baselines.setdefault(None, tokens)  # peers compare with the first baseline
                row.tokens += len(tokens)
                row.seconds += seconds
                row.steps += steps
                row.produced += produced
                row.prompts += 1
                row.identical += int(tokens == baselines.get(row.weights, baselines.get(None)))
                row.same_as_reference += int(tokens == baselines.get(None))
                row.outputs.append(tokens)
                bar.advance(task)
                bar.refresh()

    results = []
    for row in rows.values():
        base = rows.get(f"none [{row.weights}]" if multi and row.weights else "none") or rows[
            f"none [{modes[0]}]" if multi else "none"]
        base_tps, base_decode = base.tokens_per_s, base.decode_tokens_per_s
        decode = row.decode_tokens_per_s
        results.append({
            "method": row.name,
            "weights": mode_parts(row.weights)[0] if row.weights else None,
            "precision": mode_parts(row.weights)[1] if row.weights else None,
            "mode": row.weights,
            "tokens_per_s": round(row.tokens_per_s, 2),
            "decode_tokens_per_s": round(decode, 2) if decode else None,
            "decode_speedup": round(decode / base_decode, 3) if decode and base_decode else None,
            "tau": round(row.tau, 3) if row.tau is not None else None,
            "speedup": round(row.tokens_per_s / base_tps, 3) if base_tps else None,
            "identical_to_baseline": row.identical == row.prompts,
            "identical_prompts": row.identical,
            f"identical_to_{modes[0]}_baseline": row.same_as_reference,
            "prompts": row.prompts,
            "tokens": row.tokens,
            "seconds": round(row.seconds, 3),
            **(row.split.fields() if row.weights is not None else {}),
        })
    machine = machine_info(first.model)
    machine["weights"] = {w: {"kernels": getattr(sessions[w].model, "kernels", None),
                              "weight_bytes": getattr(sessions[w].model, "weight_bytes", None)} for w in modes}
    report = {"machine": machine, "model": first.model_name, "prompts_file": str(args.prompts),
              "dtype": args.dtype, "weights": modes, "max_new_tokens": base_config.max_new_tokens,
              "config": {k: v for k, v in base_config.to_dict().items() if k != "method"}, "results": results}
    for w, warm_captures in graphs.items():
        static = getattr(sessions[w].model, "_static", None)
        if static is None:
            continue
        timed = static.captures - warm_captures["total"]
        report.setdefault("cuda_graphs", {})[w] = {"captured_before_timing": warm_captures["total"],
                                                   "captured_by_bucket_sweep": warm_captures["captured"],
                                                   "captured_while_timing": timed, "replays": static.replays}
        if timed:
            print(f"bench: {timed} CUDA graph capture(s) happened inside timed runs ({w}); those prompts are slower")
    reference = rows[f"none [{modes[0]}]" if multi else "none"]
    bandwidth = baseline_bandwidth(first.model, reference.decode_tokens_per_s, getattr(args, "peak_bandwidth", None))
    if bandwidth is not None:
        report["bandwidth"] = bandwidth
    print_table(report)
    if bandwidth is not None and bandwidth["fraction_of_limit"] is not None:
        print(f"baseline: {bandwidth['achieved_gbps']:.0f} GB/s of weights streamed, "
              f"{bandwidth['fraction_of_limit']:.1%} of the {bandwidth['peak_gbps']:.0f} GB/s peak "
              f"(limit {bandwidth['limit_tokens_per_s']:.0f} tok/s)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


def prompt_tokens(session, prompt: Prompt) -> int:
    """Tokens ``prompt`` takes as the session encodes it (raw text or the chat template)."""
    tok = session.tokenizer
    return len(tok.encode(prompt.text) if prompt.text is not None else tok.encode_chat(prompt.messages))


def size_cache_for(session, prompts: list[Prompt], configs) -> None:
    """CUDA: allocate the session's KV cache for the longest prompt's answer and tree now.

    Graphs are captured per cache address, and the session grows its cache when a prompt needs
    more room; growing inside a timed run would recapture every bucket there. On CPU (no graphs)
    nothing is done: the cache grows as it always has, and tests pay nothing for tokenising."""
    if getattr(session.model, "_static", None) is None:
        return
    configs = list(configs)
    room = max(c.max_new_tokens for c in configs) + max(c.max_tree_tokens for c in configs)
    session._ensure_capacity(max(prompt_tokens(session, p) for p in prompts) + room)


def capture_verify_graphs(session) -> dict[str, int]:
    """CUDA: capture the verify forward's graph of every tree-size bucket (1, 2, ... 64) on the
    session's KV cache before timing, and build their Triton kernels.

    engine/gpu/static.py captures one graph per bucket the first time a forward of that size
    runs; the short warm-up answers reach only some buckets (an adaptive tree's size varies step
    by step), so the rest would be captured inside a timed prompt. One verify-shaped forward per
    bucket on the empty cache captures them all (K/V land in scratch slots that the next prefill
    overwrites; the session is reset after). Returns {"captured": graphs captured here, "total":
    captures so far}; zeros where the model has no static decoder (CPU, --backend hf)."""
    import torch

    from engine.gpu.static import BUCKETS

    model = session.model
    static = getattr(model, "_static", None)
    if static is None:
        return {"captured": 0, "total": 0}
    session.reset()
    cache = session._cache
    before = static.captures
    if cache is not None:
        for b in BUCKETS:
            if b > cache.capacity:
                break
            model.forward(torch.zeros(b, dtype=torch.int64), cache, positions=torch.arange(b),
                          tree_mask=torch.ones(b, b, dtype=torch.bool).tril_())
        _sync(model)
    session.reset()
    return {"captured": static.captures - before, "total": static.captures}


def baseline_bandwidth(model, decode_tokens_per_s: float | None, peak_gbps: float | None) -> dict | None:
    """The baseline's fraction of the memory-bandwidth limit: on a GPU (peak looked up by name) or
    wherever ``--peak-bandwidth`` is given; None for models that are not ours or no decode rate."""
    from engine.gpu.bandwidth import bandwidth_report, peak_bandwidth_gbps, weight_bytes_per_token

    if not decode_tokens_per_s or not hasattr(model, "layers"):
        return None
    device = getattr(model, "device", None)
    if peak_gbps is None and device is not None and device.type == "cuda":
        import torch

        peak_gbps = peak_bandwidth_gbps(torch.cuda.get_device_name(device))
    if peak_gbps is None:
        return None
    return bandwidth_report(weight_bytes_per_token(model), 1e3 / decode_tokens_per_s, peak_gbps)


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    machine = report["machine"]
    kernels = f", {machine['kernels']} kernels" if "kernels" in machine else ""
    if machine.get("kernel_variant"):
        kernels += f" ({machine['kernel_variant']})"
    weights = report.get("weights")
    if weights:
        kernels += f", weights {'/'.join(weights)}"
    table = Table(title=f"{report['model']} on {machine['cpu']} ({machine['threads']} threads{kernels})")
    for col in ("method", "tokens/s", "tau", "speedup", "decode tok/s", "decode speedup", "draft|verify ms",
                "paused", "identical", "tokens", "seconds"):
        table.add_column(col, justify="left" if col == "method" else "right", no_wrap=col == "method")
    multi = len(report.get("weights") or ()) > 1
    for r in report["results"]:
        table.add_row(
            f"{r['method']} ({r['mode']})" if multi and r.get("mode") else r["method"],
            f"{r['tokens_per_s']:.2f}", "-" if r["tau"] is None else f"{r['tau']:.2f}",
            f"{r['speedup']:.2f}x" if r["speedup"] else "-",
            f"{r['decode_tokens_per_s']:.2f}" if r["decode_tokens_per_s"] else "-",
            f"{r['decode_speedup']:.2f}x" if r["decode_speedup"] else "-",
            f"{r['draft_ms_per_step']:.2f}|{r['verify_ms_per_step']:.2f}" if r.get("draft_ms_per_step") is not None
            else "-",
            f"{r['paused_share']:.0%}" if r.get("paused_share") is not None else "-",
            f"{r['identical_prompts']}/{r['prompts']}", str(r["tokens"]), f"{r['seconds']:.1f}",
        )
    console = Console()
    if not console.is_terminal:  # a pipe or file: do not squeeze the table into 80 columns
        console = Console(width=160)
    console.print(table)


def measure_cost_curve(model, context: int, sizes=(1, 2, 4, 8, 16, 32, 64)) -> list[dict[str, float]]:
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
            _sync(model)
            t0 = time.perf_counter()
            model.forward(tokens, cache, positions=positions, tree_mask=mask)
            _sync(model)
            times.append((time.perf_counter() - t0) * 1e3)
        ms = sorted(times)[len(times) // 2]  # the median resists a stray slow call
        base_ms = base_ms or ms
        results.append({"n": n, "ms": round(ms, 2), "relative": round(ms / base_ms, 3)})
    return results


def _sync(model) -> None:
    """Wait for the GPU, so a timing covers the work and not only its launch."""
    import torch

    device = getattr(model, "device", None)
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def run_cost_curve(sessions: dict[str, Any], args: argparse.Namespace) -> int:
    """Time one target forward over n new tokens (a tree mask) on top of ~context cached tokens,
    for each --weights mode (and transformers with --peers hf)."""
    from rich.console import Console
    from rich.table import Table

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
