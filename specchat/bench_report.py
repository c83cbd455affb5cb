"""``specchat bench``'s tallies and report: one row per runner, the machine, the table.

Why apart from the runner: what is counted (tokens, steps, identical answers, the draft/verify
split) and how it is reported (the JSON results, the rich table) change for other reasons than
how the runs are scheduled and timed (bench.py).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.outputs import Output
from specchat.options import UsageError

if TYPE_CHECKING:
    from specchat.command_options import ModelOptions

# every --json of bench (its runs, --cost-curve, --data-engine, --train-speed, --random-weights): marked as its own
BENCH_JSON = Output("bench", "--json", "json", example="bench.json")
_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi", "avx512_bf16", "avx_vnni",
          "amx_int8", "amx_bf16")  # the ones our kernels choose variants by


@dataclass(frozen=True)
class Run:
    """One timed answer: its tokens (a final stop token excluded), the steps taken, the tokens
    produced (a final stop token included, as tau counts it), the wall time and the prefill time
    (None for peers, which do not report it apart)."""

    tokens: list[int]
    steps: int
    produced: int
    seconds: float
    prefill_s: float | None


def cpu_name_and_flags() -> tuple[str, list[str]]:
    """The CPU's model name and the instruction-set flags our kernels choose variants by."""
    cpu = platform.processor() or platform.machine()
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
    return cpu, flags


def machine_info(model: object | None = None) -> dict[str, Any]:
    """The machine, plus which compute path the model runs (our native CPU kernels or torch's)."""
    import torch

    cpu, flags = cpu_name_and_flags()
    info = {"cpu": cpu, "cpu_flags": flags, "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "python": platform.python_version(), "platform": platform.platform()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    kernels = getattr(model, "kernels", None)
    device = getattr(model, "device", None)
    if kernels and isinstance(device, torch.device) and device.type == "cuda":
        # the model's linears as built: batch-invariant Triton ones or cuBLAS (SPECCHAT_CUDA_LINEAR)
        info["cuda_linear"] = "invariant" if kernels == "invariant" else "cublas"
    if kernels:
        info["kernels"] = kernels
        from engine.kernels import native

        info["kernel_variant"] = native.variant() if kernels == "native" else "torch"
        kernel = native.load() if kernels == "native" else None
        if kernel is not None and kernel.fast_variant:
            # the fast precision's tiles: amx, avx512vnni, avxvnni, avx2; "+bf16" where a bf16
            # model's products run on vdpbf16ps (fast_bf16.c)
            bf16 = kernel.fast_bf16 and "bf16" in getattr(model, "stored_kinds", ())
            info["fast_kernel_variant"] = kernel.fast_variant + ("+bf16" if bf16 else "")
    return info


@dataclass
class StepSplit:
    """Where our steps' time went: drafting vs verifying, levels drafted (drafters that pay per
    level), steps with drafting paused by the adaptive budget, the share of drafted steps it drafted
    as chains rather than the configured tree, the n-gram drafter's steps and accepted drafts from
    its corpus of the model's past answers; and acceptance per depth over all
    the prompts (counted as the engine's running stats count it), where Medusa's independent heads
    and EAGLE's autoregressive one differ most."""

    steps: int = 0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    levels: int = 0
    paused: int = 0
    widths: int = 0  # drafted steps whose top-k the budget chose
    chains: int = 0  # of those, the ones it drafted as a chain (top-k 1)
    tree_tokens: int = 0  # tokens verified, the root included: what the budget let through
    corpus_steps: int = 0  # steps whose tree came from the n-gram drafter's corpus of past answers
    corpus_accepted: int = 0  # drafts accepted on those steps
    accepted: int = 0  # drafts accepted on all steps
    depths: Any = None  # engine.answer_stats.RunningTally: attempts and accepts per depth
    payoff: Any = None  # engine.events.DraftPayoff: the budget's last word on whether drafting pays here

    def add(self, step: Any) -> None:
        from engine.answer_stats import RunningTally

        self.steps += 1
        self.draft_ms += step.timing.draft_ms
        self.verify_ms += step.timing.verify_ms
        self.levels += step.draft_levels
        self.paused += int(step.draft_paused)
        self.widths += int(step.draft_width > 0)
        self.chains += int(step.draft_width == 1)
        self.tree_tokens += len(step.tree)
        self.accepted += len(step.accepted)
        if step.tree.source == "corpus":
            self.corpus_steps += 1
            self.corpus_accepted += len(step.accepted)
        if self.depths is None:
            self.depths = RunningTally()
        self.depths.add_step(step.tree, step.accepted, 0, 0, step.timing)
        if step.payoff is not None:
            self.payoff = step.payoff

    def accept_by_depth(self) -> list[float]:
        """Of the steps whose tree reached depth d (d = 1, 2, ...), the share that accepted a draft there."""
        if self.depths is None:
            return []
        return [round(a / t, 3) for a, t in zip(self.depths.accepts, self.depths.attempts, strict=True) if t]

    def fields(self) -> dict[str, float | None]:
        n = self.steps
        return {
            "draft_ms_per_step": round(self.draft_ms / n, 3) if n else None,
            "verify_ms_per_step": round(self.verify_ms / n, 3) if n else None,
            "mean_draft_levels": round(self.levels / n, 3) if n else None,
            "paused_share": round(self.paused / n, 3) if n else None,
            "mean_tree_tokens": round(self.tree_tokens / n, 3) if n else None,
            "chain_share": round(self.chains / self.widths, 3) if self.widths else None,
            # n-gram: the steps drafted from the model's past answers, and their share of the accepted drafts
            "corpus_step_share": round(self.corpus_steps / n, 3) if self.corpus_steps else None,
            "corpus_draft_share": (round(self.corpus_accepted / self.accepted, 3)
                                   if self.corpus_steps and self.accepted else None),
            "accept_by_depth": self.accept_by_depth(),
            "payoff": payoff_fields(self.payoff),
        }


def payoff_fields(payoff: Any) -> dict[str, Any] | None:
    """The budget's reckoning of whether drafting pays here (engine/payoff.py), as the JSON reports it."""
    if payoff is None:
        return None
    needed = None if payoff.needed is None else round(payoff.needed, 3)
    return {"draft_share": round(payoff.draft_share, 3), "needed": needed, "depth": payoff.depth,
            "reached": round(payoff.reached, 3), "pays": payoff.pays}


def cannot_pay_line(method: str, payoff: dict[str, Any] | None) -> str | None:
    """One line for a row whose drafter cannot pay on this machine, saying why in the cost model's
    terms (engine/payoff.py); None for a row that pays or was not reckoned."""
    if payoff is None or payoff["pays"]:
        return None
    cost = f"its draft step costs {payoff['draft_share']:.0%} of a target step"
    if payoff["needed"] is None:
        need = "no acceptance pays (even drafts that are always kept lose to plain decoding)"
    else:
        chain = f"a chain of {payoff['depth']}" if payoff["depth"] > 1 else "one draft a step"
        need = f"it would need an acceptance of {payoff['needed']:.0%} per token ({chain})"
    return f"{method} cannot pay here: {cost}, {need}, it reached {payoff['reached']:.0%}"


def print_payoffs(report: dict[str, Any]) -> None:
    """A line per row whose drafter cannot pay here (the adaptive budget then keeps it paused)."""
    for r in report["results"]:
        line = cannot_pay_line(f"{r['method']} ({r['mode']})" if len(report.get("weights") or ()) > 1
                               else r["method"], r.get("payoff"))
        if line:
            print(line)


@dataclass
class Row:
    """One runner's totals over the prompts: a method on one weights mode, or a peer."""

    name: str
    weights: str | None = None  # the mode ("stored", "fp32", "stored/fast", ...) for our rows; None for peers
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    produced: int = 0
    prefill_seconds: float | None = 0.0  # None for peers, whose prefill is not reported apart
    identical: int = 0  # equal to the baseline of the same weights
    same_as_reference: int = 0  # equal to the baseline of the first --weights mode
    prompts: int = 0
    decoded: int = 0  # tokens after each answer's first (an empty answer has none)
    outputs: list[list[int]] = field(default_factory=list)
    split: StepSplit = field(default_factory=StepSplit)

    @property
    def ours(self) -> bool:
        return self.weights is not None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after each answer's first over the time after the prefill (ours only); None where nothing
        was decoded (answers that stopped at once: no rate, never a negative one)."""
        if self.prefill_seconds is None or self.seconds <= self.prefill_seconds or not self.decoded:
            return None
        return self.decoded / (self.seconds - self.prefill_seconds)

    @property
    def tau(self) -> float | None:
        return self.produced / self.steps if self.steps else None

    def add(self, run: Run, baselines: dict[str | None, list[int]]) -> None:
        """Count one prompt's run; ``baselines`` maps a mode (and None, the first mode) to the
        baseline's tokens for this prompt."""
        self.prefill_seconds = None if run.prefill_s is None or self.prefill_seconds is None else (
            self.prefill_seconds + run.prefill_s)
        self.tokens += len(run.tokens)
        self.decoded += max(len(run.tokens) - 1, 0)
        self.seconds += run.seconds
        self.steps += run.steps
        self.produced += run.produced
        self.prompts += 1
        self.identical += int(run.tokens == baselines.get(self.weights, baselines.get(None)))
        self.same_as_reference += int(run.tokens == baselines.get(None))
        self.outputs.append(run.tokens)

    def result(self, base: Row, reference_mode: str) -> dict[str, Any]:
        """The row's JSON result, its speed-ups taken against ``base`` (the baseline of its mode)."""
        base_tps, base_decode = base.tokens_per_s, base.decode_tokens_per_s
        decode = self.decode_tokens_per_s
        weights, precision = mode_parts(self.weights) if self.weights else (None, None)
        return {
            "method": self.name,
            "weights": weights,
            "precision": precision,
            "mode": self.weights,
            "tokens_per_s": round(self.tokens_per_s, 2),
            "decode_tokens_per_s": round(decode, 2) if decode else None,
            "decode_speedup": round(decode / base_decode, 3) if decode and base_decode else None,
            "tau": round(self.tau, 3) if self.tau is not None else None,
            "speedup": round(self.tokens_per_s / base_tps, 3) if base_tps else None,
            "identical_to_baseline": self.identical == self.prompts,
            "identical_prompts": self.identical,
            f"identical_to_{reference_mode}_baseline": self.same_as_reference,
            "prompts": self.prompts,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            # the prompts' prefill (and first token), per prompt: what --precision changes most on
            # long prompts, and what decode tok/s leaves out
            "prefill_ms_per_prompt": (round(1e3 * self.prefill_seconds / self.prompts, 2)
                                      if self.prefill_seconds is not None and self.prompts else None),
            **(self.split.fields() if self.ours else {}),
        }


def mode_parts(mode: str) -> tuple[str, str]:
    """"stored/fast" -> ("stored", "fast"); "fp32" -> ("fp32", "exact")."""
    weights, _, precision = mode.partition("/")
    return weights, precision or "exact"


def weights_modes(target: ModelOptions) -> list[str]:
    """``--weights stored,fp32`` x ``--precision exact,fast`` -> the modes to load, one session each:
    "stored", "fp32" (exact precision only), or "stored/exact", "stored/fast" (order kept,
    duplicates dropped). Each method is compared with the baseline of its own mode."""
    def listed(value: str | None, default: str) -> list[str]:
        return list(dict.fromkeys(v.strip() for v in (value or default).split(",") if v.strip()))

    weights = listed(target.weights, "stored")
    bad = [w for w in weights if w not in ("stored", "fp32")]
    if bad or not weights:
        raise UsageError(f"--weights takes stored, fp32 or stored,fp32, not {target.weights!r}")
    precisions = listed(target.precision, "auto")
    bad = [p for p in precisions if p not in ("auto", "exact", "fast")]
    if bad or not precisions:
        raise UsageError(f"--precision takes auto, exact, fast or exact,fast, not {target.precision!r}")
    if "auto" in precisions and len(precisions) > 1:
        raise UsageError("--precision auto stands alone; name them to compare (exact,fast)")
    if precisions == ["auto"]:  # fast where it runs, for a run of stored weights alone
        from engine.loader import LoadError, pick_device, pick_dtype, resolve_precision

        precisions = ["exact"]
        if weights == ["stored"]:
            try:
                device = pick_device(target.device or "auto")
                precisions = [resolve_precision("auto", device=device, backend=target.backend or "auto",
                                                dtype=pick_dtype(target.dtype or "auto", device))]
            except LoadError as exc:
                raise UsageError(str(exc)) from None
    if "fast" in precisions and "fp32" in weights:
        raise UsageError("--precision fast runs on stored weights only; drop fp32 from --weights")
    if precisions == ["exact"]:
        return weights
    return [f"{w}/{p}" for w in weights for p in precisions]


def print_table(report: dict[str, Any]) -> None:
    """The results as a rich table (wide when printed to a pipe or a file)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a pipe or file: do not squeeze the table into 80 columns
        console = Console(width=160)
    console.print(results_table(report))


def variant_words(machine: dict[str, Any]) -> str:
    """Which tiles ran, for a table title: "avx512" or, where the fast precision has its own
    (AMX, VNNI), "avx512, fast: amx"."""
    fast = machine.get("fast_kernel_variant")
    return machine["kernel_variant"] + (f", fast: {fast}" if fast else "")


def linear_words(machine: dict[str, Any]) -> str:
    """", invariant linears" or ", cuBLAS linears" for a GPU title ("" when the run did not say)."""
    linear = machine.get("cuda_linear")
    return f", {'cuBLAS' if linear == 'cublas' else linear} linears" if linear else ""


def results_table(report: dict[str, Any]) -> Any:
    """The results as a rich Table (printed by :func:`print_table`, drawn by ``bench --plot``)."""
    from rich.table import Table

    machine = report["machine"]
    weights = report.get("weights")
    shown = f", weights {'/'.join(weights)}" if weights else ""
    if machine.get("gpu"):  # the host's CPU only feeds the GPU: name the GPU and the precision
        graphs = ", CUDA graphs" if report.get("cuda_graphs") else ""
        graphs += linear_words(machine)
        where = f"{machine['gpu']} ({report.get('dtype') or 'auto'}{graphs}{shown})"
    else:
        kernels = f", {machine['kernels']} kernels" if "kernels" in machine else ""
        if machine.get("kernel_variant"):
            kernels += f" ({variant_words(machine)})"
        where = f"{machine['cpu']} ({machine['threads']} threads{kernels}{shown})"
    rounds = f", best of {report['rounds']} rounds" if report.get("rounds", 1) > 1 else ""
    table = Table(title=f"{report['model']} on {where}{rounds}")
    for col in ("method", "tokens/s", "tau", "speedup", "decode tok/s", "decode speedup", "draft|verify ms",
                "paused", "accept by depth", "identical", "tokens", "seconds"):
        table.add_column(col, justify="left" if col == "method" else "right", no_wrap=col == "method")
    multi = len(report.get("weights") or ()) > 1
    differs = differs_by_design(report)
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
            depth_cells(r.get("accept_by_depth")),
            "-" if differs and r["method"] != "none" else f"{r['identical_prompts']}/{r['prompts']}",
            str(r["tokens"]), f"{r['seconds']:.1f}",
        )
    return table


def differs_by_design(report: dict[str, Any]) -> bool:
    """Whether the run's answers may differ from the baseline's by design: rejection sampling draws
    differently from plain sampling, so a drafted answer is another sample of the same distribution,
    not the baseline's (no identical count to show; bench says so before it times)."""
    config = report.get("config") or {}
    return config.get("temperature", 0) > 0 and config.get("sampling") == "rejection"


def depth_cells(shares: list[float] | None, deepest: int = 6) -> str:
    """Acceptance per depth for the table: "71% 42% 20% 8%" (depth 1, 2, ...), "-" for none."""
    if not shares:
        return "-"
    return " ".join(f"{s:.0%}" for s in shares[:deepest]) + ("…" if len(shares) > deepest else "")
