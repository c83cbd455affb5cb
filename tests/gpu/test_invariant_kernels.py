"""The batch-invariant linear and RMSNorm kernels (engine/gpu/linear.py, engine/gpu/rms_norm.py).

The property greedy speculation needs on a GPU: a row's output is the same bits whether it is
computed alone (a decode step), among 2-64 rows (a verify tree) or in a prefill of more than one
row block, and it is the right product (near a float64 reference within bf16 rounding). Checked on
random bf16 weights of the shapes the engine runs: SmolLM2-135M (the embedded model: hidden 576,
intermediate 1536, vocab 49152) and Llama-3.1-8B (hidden 4096, intermediate 14336, vocab 128256).

The property depends on K and on the weight's tile config, not on N, so each shape keeps the real
weight's config (``config_for(N, K)``) and multiplies only one column tile of it: the interpreter
runs every program in Python, and K = 14,336 is 224 steps of it. Under ``kernel_device`` the same
assertions run compiled on a GPU machine, where the bits come from the tensor cores.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.gpu.linear import BLOCK_M, TileConfig, config_for, invariant_linear
from engine.gpu.rms_norm import invariant_rms_norm
from tests.gpu.tensor_core import TensorCore

PREFILL = BLOCK_M + 6  # two row blocks, the second partial: a prefill of more than one tile
ALL_COUNTS = tuple(range(1, BLOCK_M + 1))
SOME_COUNTS = (1, 2, 3, 7, 16, 31, 48, 64)  # the long reductions: fewer launches, the buckets and odd counts

# (name, N of the real weight, K, row counts checked)
SMOL = [("smol-qkv", 960, 576, ALL_COUNTS), ("smol-o", 576, 576, SOME_COUNTS),
        ("smol-gate_up", 3072, 576, SOME_COUNTS), ("smol-down", 576, 1536, ALL_COUNTS),
        ("smol-lm_head", 49152, 576, SOME_COUNTS)]
LLAMA_8B = [("8b-qkv", 6144, 4096, (1, 5, 64)), ("8b-o", 4096, 4096, (1, 64)),
            ("8b-gate_up", 28672, 4096, (1, 64)), ("8b-down", 4096, 14336, (1, 2, 7, 33, 64)),
            ("8b-lm_head", 128256, 4096, (1, 64))]


def bf16_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within one bf16 ulp of the exact value (plus fp32 accumulation, far below it): a compiled
    kernel rounds to nearest (half an ulp), triton's interpreter narrows fp32 to bf16 toward zero."""
    torch.testing.assert_close(got.double(), want, rtol=2**-7, atol=1e-3)


def random_case(n: int, k: int, rows: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, k] and W [n, k] in bf16, scaled like a trained layer's (outputs of order one)."""
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(device, torch.bfloat16)
    x = torch.randn(rows, k, generator=g).to(device, torch.bfloat16)
    return x, w


def check_rows_invariant(x: torch.Tensor, w: torch.Tensor, counts: tuple[int, ...],
                         linear: Callable[..., torch.Tensor] = invariant_linear, **kwargs) -> torch.Tensor:
    """Every count's rows (a window of the prefill at a count-dependent offset, so rows move within
    their tile) equal the prefill's bits for them; returns the prefill's output."""
    full = linear(x, w, **kwargs)
    rows = x.shape[0]
    for m in counts:
        start = (m * 37) % (rows - m + 1)
        part = linear(x[start:start + m], w, **kwargs)
        assert torch.equal(part, full[start:start + m]), f"{m} rows from row {start} differ from the prefill's"
    return full


@pytest.mark.parametrize(("n", "k", "counts"), [case[1:] for case in SMOL + LLAMA_8B],
                         ids=[case[0] for case in SMOL + LLAMA_8B])
def test_a_row_has_the_same_bits_alone_in_a_tree_and_in_a_prefill(kernel_device, n: int, k: int,
                                                                  counts: tuple[int, ...]) -> None:
    config = config_for(n, k)
    x, w = random_case(config.block_n, k, PREFILL, seed=k + n, device=kernel_device)
    full = check_rows_invariant(x, w, counts, config=config)
    bf16_close(full, x.double() @ w.double().T)


def test_bias_fp32_output_and_ragged_edges(kernel_device) -> None:
    """K not a multiple of BLOCK_K, N not a multiple of BLOCK_N, a bias, fp32 out, leading dims."""
    x, w = random_case(45, 100, PREFILL, seed=3, device=kernel_device)
    bias = torch.randn(45, generator=torch.Generator().manual_seed(4)).to(kernel_device, torch.bfloat16)
    want = x.double() @ w.double().T + bias.double()
    full = check_rows_invariant(x, w, (1, 6, 64), bias=bias, out_dtype=torch.float32)
    assert full.dtype == torch.float32
    torch.testing.assert_close(full.double(), want, rtol=1e-5, atol=1e-4)  # fp32 out: no bf16 rounding
    y = invariant_linear(x[:6].view(2, 3, 100), w, bias)
    assert y.shape == (2, 3, 45) and y.dtype == torch.bfloat16
    assert torch.equal(y.reshape(6, 45), invariant_linear(x, w, bias)[:6])


def _by_rows(pick: Callable[[int, TileConfig], TileConfig]) -> Callable[..., torch.Tensor]:
    """A mutant of the kernel's launch: the tile config chosen by the call's row count."""

    def linear(rows: torch.Tensor, weight: torch.Tensor, **kwargs) -> torch.Tensor:
        config = config_for(*weight.shape)
        return invariant_linear(rows, weight, config=pick(rows.shape[0], config), **kwargs)

    return linear


def _split_k_below_a_tile(rows: torch.Tensor, weight: torch.Tensor, **kwargs) -> torch.Tensor:
    """A mutant: split-K for small calls (two half reductions added at the end), as cuBLAS does for
    a few rows of a long K."""
    if rows.shape[0] >= BLOCK_M:
        return invariant_linear(rows, weight, **kwargs)
    half = weight.shape[1] // 2
    return (invariant_linear(rows[:, :half].contiguous(), weight[:, :half].contiguous(), **kwargs)
            + invariant_linear(rows[:, half:].contiguous(), weight[:, half:].contiguous(), **kwargs))


# what cuBLAS's per-shape choices amount to; the invariance check must fail on each, on every machine,
# or it proves nothing (fp32 out, so no bf16 rounding can hide a difference)
MUTANTS = {
    "k-step-by-rows": _by_rows(lambda m, c: c if m == 1 else dataclasses.replace(c, block_k=16)),
    "tile-rows-by-rows": _by_rows(lambda m, c: dataclasses.replace(c, block_m=16) if m <= 16 else c),
    "split-k-by-rows": _split_k_below_a_tile,
}


@pytest.mark.parametrize("mutant", MUTANTS.values(), ids=MUTANTS.keys())
def test_the_check_catches_a_kernel_that_follows_the_row_count(kernel_device, mutant) -> None:
    x, w = random_case(32, 512, PREFILL, seed=5, device=kernel_device)
    check_rows_invariant(x, w, (1,), out_dtype=torch.float32)  # the kernel itself passes
    with pytest.raises(AssertionError, match="differ from the prefill's"):
        check_rows_invariant(x, w, (1,), linear=mutant, out_dtype=torch.float32)


def check_same_tiles(core: TensorCore, x: torch.Tensor, w: torch.Tensor, counts: tuple[int, ...],
                     linear: Callable[..., torch.Tensor] = invariant_linear) -> None:
    """The kernel's structure, read from the dots it issues: a call of any row count runs exactly the
    tiles of one of the prefill's row blocks (the same tile shapes, as many of each)."""
    def dots(rows: torch.Tensor) -> Counter:
        with core.recording() as seen:
            linear(rows, w)
        return Counter(seen)

    full = dots(x)
    blocks = -(-x.shape[0] // BLOCK_M)
    one_block = Counter({shape: n // blocks for shape, n in full.items()})
    assert sum(one_block.values()) * blocks == sum(full.values())
    for m in counts:
        got = dots(x[:m])
        assert got == one_block, f"{m} rows ran other tiles than a row block of the prefill: {got} != {one_block}"


def test_every_row_count_runs_the_same_tiles(kernel_device, tensor_core: TensorCore | None) -> None:
    """One tile shape and one K walk for every M (the interpreter only: it sees each dot)."""
    if tensor_core is None:
        pytest.skip("compiled kernels: the dots are read from the compiled code (test_compile_sm90.py)")
    n, k = 45, 200  # a ragged last K step and column tile
    x, w = random_case(n, k, PREFILL, seed=9, device=kernel_device)
    check_same_tiles(tensor_core, x, w, (1, 2, 17, 64))
    cfg = config_for(n, k)
    with tensor_core.recording() as seen:
        invariant_linear(x[:3], w)
    assert set(seen) == {((cfg.block_m, cfg.block_k), (cfg.block_k, cfg.block_n))}
    assert len(seen) == -(-n // cfg.block_n) * -(-k // cfg.block_k)  # no split of K: one dot a K step
    for name in ("k-step-by-rows", "tile-rows-by-rows"):
        with pytest.raises(AssertionError, match="ran other tiles"):
            check_same_tiles(tensor_core, x, w, (1,), linear=MUTANTS[name])


def test_refuses_mixed_dtypes(kernel_device) -> None:
    x, w = random_case(8, 16, 2, seed=0, device=kernel_device)
    with pytest.raises(TypeError, match="bf16/fp16"):
        invariant_linear(x.float(), w)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=st.integers(1, BLOCK_M), k=st.integers(1, 160), n=st.integers(1, 72), seed=st.integers(0, 2**16))
def test_any_small_shape_is_invariant_and_right(kernel_device, m: int, k: int, n: int, seed: int) -> None:
    x, w = random_case(n, k, PREFILL, seed=seed, device=kernel_device)
    full = check_rows_invariant(x, w, (m,))
    bf16_close(full, x.double() @ w.double().T)


# ---- RMSNorm ------------------------------------------------------------------------------------
@pytest.mark.parametrize("hidden", [576, 4096, 64, 128])  # the two models' hidden sizes, q/k norms' head dims
def test_rms_norm_rows_are_invariant_and_match_torch(kernel_device, hidden: int) -> None:
    g = torch.Generator().manual_seed(hidden)
    rows = 24  # one program per row: a few rows show it (the interpreter is slow on 4096-wide rows)
    x = (3 * torch.randn(rows, hidden, generator=g)).to(kernel_device, torch.bfloat16)
    weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(kernel_device, torch.bfloat16)
    full = invariant_rms_norm(x, weight, 1e-5)
    for m in (1, 2, 17):
        start = (m * 5) % (rows - m + 1)
        assert torch.equal(invariant_rms_norm(x[start:start + m], weight, 1e-5), full[start:start + m])
    want = F.rms_norm(x.cpu().float(), (hidden,), weight.cpu().float(), 1e-5)
    torch.testing.assert_close(full.cpu().float(), want, rtol=2**-6, atol=1e-3)  # two bf16 roundings
    heads = x[:4].view(4, hidden // 32, 32)[:, 1:]  # a strided view of heads (the q/k norms' input)
    assert torch.equal(invariant_rms_norm(heads, weight[:32], 1e-5),
                       invariant_rms_norm(heads.contiguous(), weight[:32], 1e-5))
