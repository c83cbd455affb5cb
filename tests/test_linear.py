"""Every CPU linear layout computes x @ W.T + b (within fp32's worst-case bound of the float64
product), for every row count and odd sizes, and the native kernel gives a row the same bits
whether it is computed alone or among others."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from engine.kernels import native
from engine.kernels.linear import Linear, cpu_layout
from tests.numerics import assert_linear_within_fp32_bound

LAYOUTS = ["native", "blocked", "torch"]


@pytest.fixture(params=LAYOUTS)
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "native":
        if native.load() is None:
            pytest.skip(f"native kernel unavailable: {native.why_not}")
        monkeypatch.delenv(native.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(native.ENV_SWITCH, request.param)
    return request.param


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 7, 16, 33])
@pytest.mark.parametrize("out_features", [16, 45, 97])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_f_linear(layout: str, rows: int, out_features: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows * out_features)
    w = torch.randn(out_features, 24, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    x = torch.randn(rows, 24, generator=g)
    layer = Linear(w, b)
    assert layer.layout == layout
    # against the float64 product with fp32's worst-case bound, not F.linear at a fixed 1e-5: F.linear's
    # own bits follow the host's BLAS (kernel by shape, ISA and threads), so its distance would too
    assert_linear_within_fp32_bound(layer(x), x, w, b)
    assert_linear_within_fp32_bound(layer(x.view(1, rows, 24))[0], x, w, b)
    torch.testing.assert_close(layer.dense_weight, w)


@pytest.mark.parametrize("layout", ["native"], indirect=True)
def test_a_row_gets_the_same_bits_alone_or_in_a_batch(layout: str) -> None:
    """Only the native kernel promises this: MKL's batched product picks different code paths by row count."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(200, 576, generator=g) * 0.05
    layer = Linear(w, torch.randn(200, generator=g))
    x = torch.randn(40, 576, generator=g)
    batch = layer(x)
    for i in (0, 5, 6, 17, 39):
        assert torch.equal(layer(x[i : i + 1])[0], batch[i])
        assert torch.equal(layer(x[: i + 1])[i], batch[i])


def test_native_kernel_is_used_where_a_compiler_and_avx2_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guard against silently losing the fast path: on an x86-64 Linux box with cc and AVX2 it must load."""
    monkeypatch.delenv(native.ENV_SWITCH, raising=False)
    cpuinfo = Path("/proc/cpuinfo")
    flags = cpuinfo.read_text() if cpuinfo.exists() else ""
    if not (shutil.which("cc") or shutil.which("gcc")) or " avx2" not in flags or " fma" not in flags:
        pytest.skip("no compiler or no AVX2/FMA here")
    assert native.load() is not None, native.why_not
    assert cpu_layout() == "native"


def test_env_switch_forces_torch_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.ENV_SWITCH, "torch")
    assert Linear(torch.randn(8, 4)).layout == "torch"
    monkeypatch.setenv(native.ENV_SWITCH, "blocked")
    assert Linear(torch.randn(8, 4)).layout == "blocked"


def test_native_build_failure_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A broken compiler must not break loading: the kernel reports why and the caller keeps torch."""
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(native.ENV_SWITCH, raising=False)
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'fake compiler 1.0'; [ \"$1\" = --version ] && exit 0; echo boom >&2; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    native.load.cache_clear()
    try:
        assert native.load() is None
        assert "build failed" in native.why_not
        assert cpu_layout() == "blocked"
    finally:
        native.load.cache_clear()
