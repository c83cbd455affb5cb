"""Compile every Triton kernel ahead of time for sm_90 / sm_80, without a GPU, and report its cost.

Why: this machine and CI have no GPU, so a register spill or a dot that misses the tensor cores
would only show up as a slow step once a GPU is lent. Triton's wheel carries its own ptxas, and
compiling to PTX and then to a cubin needs no CUDA driver, so every kernel can be built here for
the targets we deploy on and the compiler's own verdict (registers, spill bytes, shared memory,
the instructions the dots became) read before any launch.

The launch arguments are not written out by hand: each kernel's real wrapper (``tree_attention``,
``greedy_walk``, ``sampling_walk``, ``compact_kv``, ``invariant_linear``, ``invariant_rms_norm``) is
called on ``meta`` tensors shaped as engine/gpu/static.py and engine/models/kv_cache.py shape them,
with ``engine.gpu.kernel`` swapped for a recorder. The recorded call goes through triton's own
binder, so the constexprs, the integer specialisations (a value of 1 becomes a constant, a
multiple of 16 a divisibility hint) and the pointer alignments are the ones a launch on the GPU
would compile.

    .venv/bin/python scripts/triton_report.py                # markdown table, sm_90 and sm_80
    .venv/bin/python scripts/triton_report.py --smoke --json # the subset tests/gpu checks

Run it with ``TRITON_INTERPRET`` unset (it is removed here before triton is imported): an
interpreted ``triton.language`` cannot be compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# kernels on the per-step critical path: a spill there costs every verify step
HOT = ("tree_attention", "tree_attention_combine", "greedy_walk", "sampling_walk", "invariant_linear", "rms_norm")
LINEARS = ("qkv", "o", "gate_up", "down", "lm_head")  # a decoder layer's products and the LM head
ARCHS = (90, 80)


@dataclass(frozen=True)
class Model:
    """The shape facts of a deployed model that reach a kernel's specialisation."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    hidden: int
    intermediate: int

    def weight(self, name: str) -> tuple[int, int]:
        """(N, K) of one of the model's matrices (``LINEARS``), as engine/models/layer.py fuses them."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"qkv": (q + 2 * kv, self.hidden), "o": (self.hidden, q),
                "gate_up": (2 * self.intermediate, self.hidden), "down": (self.hidden, self.intermediate),
                "lm_head": (self.vocab, self.hidden)}[name]


LLAMA_8B = Model("llama-8b", 32, 8, 128, 128256, 4096, 14336)  # GQA 4, head_dim 128
SMOL_135M = Model("smollm-135m", 9, 3, 64, 49152, 576, 1536)  # GQA 3 (not a power of two), head_dim 64
WINDOW = 4096  # a Mistral-style sliding window (static.py passes config.sliding_window)
CAPACITY = 1024  # static.cuda_capacity's smallest cache: a power of two, so strides are multiples of 16


@dataclass(frozen=True)
class Case:
    """One kernel specialisation: a kernel, the model shape it serves, the dtype, the tree size."""

    kernel: str
    model: Model
    dtype: str = "bf16"  # the model/KV dtype; the walks always read float32 probabilities
    tokens: int = 64  # T: the verify bucket (1 = a plain decode step)
    window: int | None = None
    has_q: bool = False  # sampling walk with the drafter's distributions
    weight: str = ""  # invariant_linear: which matrix (LINEARS); rms_norm: "hidden" or "head"

    @property
    def shape(self) -> str:
        m = self.model
        if self.kernel.startswith("tree_attention"):
            win = f" win{self.window}" if self.window else ""
            return f"T={self.tokens} {m.heads}/{m.kv_heads}h d{m.head_dim}{win}"
        if self.kernel == "kv_compact":
            return f"{m.kv_heads}kv d{m.head_dim}"
        if self.kernel == "invariant_linear":  # M is not specialised: one binary for 1-64 rows and prefill
            n, k = m.weight(self.weight)
            return f"{self.weight} N={n} K={k}"
        if self.kernel == "rms_norm":
            return f"H={m.hidden if self.weight == 'hidden' else m.head_dim}"
        if self.kernel == "sampling_walk":
            return f"V={m.vocab}" + (" +q" if self.has_q else "")
        return "T<=64"

    @property
    def id(self) -> str:
        return f"{self.kernel}[{self.shape}|{self.dtype}]".replace(" ", "_")


def full_cases() -> list[Case]:
    """Every specialisation the engine launches for the two reference shapes."""
    cases: list[Case] = []
    for model in (LLAMA_8B, SMOL_135M):
        for dtype in ("bf16", "fp32"):
            for window in (None, WINDOW):
                for tokens in (1, 8, 64):  # BLOCK_M 16 (decode), 32 or 64, 64 (largest bucket)
                    cases.append(Case("tree_attention", model, dtype, tokens, window))
            cases.append(Case("tree_attention_combine", model, dtype))
            cases.append(Case("kv_compact", model, dtype))
        cases += [Case("invariant_linear", model, weight=w) for w in LINEARS]
        cases += [Case("rms_norm", model, weight=w) for w in ("hidden", "head")]
    cases.append(Case("greedy_walk", LLAMA_8B, "fp32"))
    for model in (LLAMA_8B, SMOL_135M):
        for has_q in (False, True):
            cases.append(Case("sampling_walk", model, "fp32", has_q=has_q))
    return cases


def smoke_cases() -> list[tuple[Case, int]]:
    """A small matrix for the test suite: the largest tiles, decode, both GQA groups, both dtypes,
    window on and off, every kernel once; sm_80 only for the hot kernels' heaviest variants."""
    on90 = [
        Case("tree_attention", LLAMA_8B, "bf16", 64, WINDOW),
        Case("tree_attention", LLAMA_8B, "fp32", 64),
        Case("tree_attention", LLAMA_8B, "bf16", 1),
        Case("tree_attention", SMOL_135M, "fp32", 1, WINDOW),
        Case("tree_attention", SMOL_135M, "bf16", 64),
        Case("tree_attention_combine", LLAMA_8B, "bf16", 64),
        Case("tree_attention_combine", SMOL_135M, "fp32", 1),
        Case("greedy_walk", LLAMA_8B, "fp32"),
        Case("sampling_walk", LLAMA_8B, "fp32", has_q=True),
        Case("sampling_walk", SMOL_135M, "fp32"),
        Case("kv_compact", LLAMA_8B, "bf16"),
        Case("kv_compact", SMOL_135M, "fp32"),
        *(Case("invariant_linear", LLAMA_8B, weight=w) for w in LINEARS),
        Case("invariant_linear", SMOL_135M, weight="down"),
        Case("rms_norm", LLAMA_8B, weight="hidden"),
        Case("rms_norm", SMOL_135M, weight="hidden"),
    ]
    on80 = [
        Case("tree_attention", LLAMA_8B, "bf16", 64, WINDOW),
        Case("tree_attention_combine", LLAMA_8B, "bf16", 64),
        Case("greedy_walk", LLAMA_8B, "fp32"),
        Case("sampling_walk", LLAMA_8B, "fp32", has_q=True),
        Case("invariant_linear", LLAMA_8B, weight="gate_up"),  # the widest tile (BLOCK_N 128)
        Case("invariant_linear", LLAMA_8B, weight="down"),
        Case("rms_norm", LLAMA_8B, weight="hidden"),
    ]
    return [(c, 90) for c in on90] + [(c, 80) for c in on80]


# ---- the toolchain ------------------------------------------------------------------------------
def triton_dir() -> Path | None:
    """The installed triton package's folder, found without importing it (importing triton in a
    process whose tests use the interpreter would fix the interpreter mode for good)."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def tool(name: str) -> Path | None:
    """A binary bundled with triton's NVIDIA backend (ptxas, ptxas-blackwell, nvdisasm)."""
    base = triton_dir()
    path = base / "backends" / "nvidia" / "bin" / name if base else None
    return path if path is not None and os.access(path, os.X_OK) else None


def missing_toolchain() -> str | None:
    """Why kernels cannot be compiled here (None when they can)."""
    if triton_dir() is None:
        return "triton is not installed (pip install -e .[test] installs it)"
    for name in ("ptxas", "ptxas-blackwell"):  # triton uses ptxas-blackwell for sm_90 and up
        if tool(name) is None:
            return f"triton's bundled {name} is missing (backends/nvidia/bin)"
    return None


# ---- capturing the real launch ------------------------------------------------------------------
@dataclass
class Launch:
    """What a wrapper passed to ``kernel[grid](...)``."""

    fn: Any  # the triton JITFunction
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class _Recorder:
    """Stands in for ``engine.gpu.kernel(name, build)``'s result: indexing by a kernel name (the
    accept module's dict) selects, indexing by a grid returns a launcher that records its call."""

    def __init__(self, built: Any, sink: list[Launch]) -> None:
        self.built = built
        self.sink = sink

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return _Recorder(self.built[key], self.sink)
        return lambda *args, **kwargs: self.sink.append(Launch(self.built, args, kwargs))


@contextlib.contextmanager
def recording() -> Iterator[list[Launch]]:
    """Swap ``engine.gpu.kernel`` for a recorder (the wrappers import it at call time)."""
    import engine.gpu as gpu

    sink: list[Launch] = []
    built: dict[str, Any] = {}
    original = gpu.kernel

    def fake(name: str, build: Callable[[], Any]) -> _Recorder:
        if name not in built:
            built[name] = build()
        return _Recorder(built[name], sink)

    gpu.kernel = fake
    try:
        yield sink
    finally:
        gpu.kernel = original


def capture(case: Case) -> Launch:
    """Call the case's wrapper on meta tensors laid out as the engine lays them out."""
    import torch

    meta = torch.device("meta")
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[case.dtype]
    m, T = case.model, case.tokens
    with recording() as sink:
        if case.kernel.startswith("tree_attention"):  # two launches: the split, then the combine
            from engine.gpu.tree_attention import tree_attention

            # static.py: q is a view of the rotated [T, heads + kv_heads, hd] q|k block; the cache is
            # one layer of [layers, kv, capacity, hd]; length, positions are int64 views of one buffer
            qk = torch.empty(T, m.heads + m.kv_heads, m.head_dim, dtype=dt, device=meta)
            cache = torch.empty(2, m.kv_heads, CAPACITY, m.head_dim, dtype=dt, device=meta)
            inputs = torch.empty(2 * 64 + 1 + 64 * 64, dtype=torch.int64, device=meta)
            tree_attention(qk[:, : m.heads], cache[1], cache[1], inputs[128:129],
                           torch.empty(T, T, dtype=torch.int8, device=meta), inputs[64 : 64 + T],
                           m.head_dim**-0.5, case.window)
        elif case.kernel == "invariant_linear":
            from engine.gpu.linear import invariant_linear

            # x: the [T, K] rows a layer multiplies (the largest bucket); W: [N, K] as loaded
            n, k = m.weight(case.weight)
            invariant_linear(torch.empty(T, k, dtype=dt, device=meta), torch.empty(n, k, dtype=dt, device=meta))
        elif case.kernel == "rms_norm":
            from engine.gpu.rms_norm import invariant_rms_norm

            h = m.hidden if case.weight == "hidden" else m.head_dim
            invariant_rms_norm(torch.empty(T, h, dtype=dt, device=meta), torch.empty(h, dtype=dt, device=meta), 1e-5)
        elif case.kernel == "kv_compact":
            from engine.gpu.kv_compact import compact_kv

            k = torch.empty(4, m.kv_heads, CAPACITY, m.head_dim, dtype=dt, device=meta)
            both = torch.empty(T + 1, dtype=torch.int32, device=meta)  # kv_cache.commit: [n, *offsets]
            compact_kv(k, torch.empty_like(k), 100, both[1:], both[:1])
        else:
            from engine.gpu.accept import greedy_walk, sampling_walk

            tree = torch.empty(2, T, dtype=torch.int64, device=meta)  # accept._tree_tensors
            tokens, parents = tree[0], tree[1].to(torch.int32)
            if case.kernel == "greedy_walk":
                greedy_walk(torch.empty(T, dtype=torch.int64, device=meta), tokens, parents)
            else:
                probs = torch.empty(T, m.vocab, dtype=torch.float32, device=meta)
                q = torch.empty_like(probs) if case.has_q else None
                sampling_walk(probs, tokens, parents, torch.empty(T + 1, device=meta), q)
    if case.kernel.startswith("tree_attention"):
        split, combine = sink
        return combine if case.kernel == "tree_attention_combine" else split
    (launch,) = sink
    return launch


def compile_launch(launch: Launch, arch: int) -> Any:
    """Compile a recorded launch for ``sm_<arch>`` as ``JITFunction.run`` would, minus the driver:
    the same binder (specialisation), the same argument packing, ``triton.compile``."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.fn
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    kwargs = dict(launch.kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug  # as JITFunction.run
    for knob in ("instrumentation_mode", "fpsan_homomorphic_casts"):  # as JITFunction.run, where this
        if hasattr(knobs.compilation, knob):  # triton has the knob (torch 2.11's triton lacks the second)
            kwargs[knob] = getattr(knobs.compilation, knob)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)


# ---- reading the result -------------------------------------------------------------------------
@dataclass
class Result:
    """One compiled kernel's cost, as ptxas and the disassembly give it."""

    id: str
    kernel: str
    shape: str
    dtype: str
    arch: int
    hot: bool
    block: str  # the tile constexprs that size registers
    num_warps: int
    num_stages: int
    registers: int
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack: int  # bytes of stack frame
    shared: int  # bytes of shared memory triton allocates (dynamic)
    cubin_bytes: int
    ptx_mma: int  # mma.sync / wgmma instructions in the PTX
    sass_mma: int  # HMMA / HGMMA in the SASS (-1: no nvdisasm)
    sass_ffma: int  # FFMA in the SASS: where an fp32 ("ieee") dot went instead

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def ptxas_verdict(ptx: str, arch: int, fp_fusion: bool) -> tuple[int, int, int, int]:
    """(registers, spill store bytes, spill load bytes, stack bytes) from ``ptxas -v``, run with the
    flags triton's make_cubin uses (triton deletes its own log, so the PTX is assembled again;
    it is the fast step, ~0.2 s)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        cmd = [get_ptxas(arch).path, "-lineinfo", "-v", "--regAllocOptLevel=2",
               *([] if fp_fusion else ["--fmad=false"]),
               f"--gpu-name={sm_arch_from_capability(arch)}", str(src), "-o", str(Path(tmp) / "k.o")]
        log = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
    spill = _PTXAS_SPILL.search(log)
    regs = _PTXAS_REGS.search(log)
    if spill is None or regs is None:
        raise RuntimeError(f"unexpected ptxas -v output:\n{log}")
    stack, stores, loads = (int(x) for x in spill.groups())
    return int(regs.group(1)), stores, loads, stack


def sass_counts(cubin: bytes) -> tuple[int, int]:
    """(HMMA/HGMMA count, FFMA count) in the cubin's SASS; (-1, -1) without nvdisasm."""
    nvdisasm = tool("nvdisasm")
    if nvdisasm is None:
        return -1, -1
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([str(nvdisasm), "-c", f.name], check=True, capture_output=True, text=True).stdout
    return len(re.findall(r"\b(?:HMMA|HGMMA)\b", sass)), len(re.findall(r"\bFFMA\b", sass))


def measure(case: Case, arch: int) -> Result:
    """Compile one case for one target and read its cost."""
    launch = capture(case)
    compiled = compile_launch(launch, arch)
    md = compiled.metadata
    ptx = compiled.asm["ptx"]
    regs, stores, loads, stack = ptxas_verdict(ptx, arch, md.enable_fp_fusion)
    mma, ffma = sass_counts(compiled.asm["cubin"])
    block_keys = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_D", "BLOCK_T", "BLOCK_V", "BLOCK")
    block = " ".join(f"{k[6:] or k}={v}" for k, v in launch.kwargs.items() if k in block_keys)
    return Result(
        id=case.id, kernel=case.kernel, shape=case.shape, dtype=case.dtype, arch=arch,
        hot=case.kernel in HOT, block=block, num_warps=md.num_warps, num_stages=md.num_stages, registers=regs,
        spill_stores=stores, spill_loads=loads, stack=stack, shared=md.shared,
        cubin_bytes=len(compiled.asm["cubin"]),
        ptx_mma=len(re.findall(r"\b(?:mma\.sync|wgmma\.mma_async)\b", ptx)), sass_mma=mma, sass_ffma=ffma,
    )


def markdown(results: list[Result]) -> str:
    """The report as a markdown table."""
    head = ("| kernel | shape | dtype | target | tile | warps/stages | registers | spills (st/ld bytes) "
            "| shared | tensor cores (PTX mma / SASS HMMA,HGMMA) | SASS FFMA (static) |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in results:
        spills = "0" if r.spills == 0 else f"**{r.spill_stores}/{r.spill_loads}**"
        tc = "n/a (no dot)" if r.kernel not in ("tree_attention", "invariant_linear") else (
            f"yes ({r.ptx_mma}/{r.sass_mma})" if r.ptx_mma or r.sass_mma > 0 else "no (0/0): fp32 FMA + sum")
        lines.append(f"| {r.kernel} | {r.shape} | {r.dtype} | sm_{r.arch} | {r.block or '-'} "
                     f"| {r.num_warps}/{r.num_stages} | {r.registers} | {spills} | {r.shared} | {tc} | {r.sass_ffma} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHS), help="compute capabilities")
    parser.add_argument("--smoke", action="store_true", help="only the test suite's subset")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    parser.add_argument("--filter", default="", help="only cases whose id contains this")
    args = parser.parse_args(argv)
    reason = missing_toolchain()
    if reason:
        print(json.dumps({"skip": reason}) if args.json else reason)
        return 0 if args.json else 1
    os.environ.pop("TRITON_INTERPRET", None)
    warnings.filterwarnings("ignore", message=".*TRITON_DEFAULT_FP_FUSION.*")
    sys.path.insert(0, str(ROOT))
    todo = smoke_cases() if args.smoke else [(c, a) for a in args.arch for c in full_cases()]
    todo = [(c, a) for c, a in todo if args.filter in c.id]
    results = []
    for case, arch in todo:
        result = measure(case, arch)
        results.append(result)
        if args.json:
            print(json.dumps(asdict(result)), flush=True)
    if not args.json:
        print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
