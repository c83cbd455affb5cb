"""Every Triton kernel compiled ahead of time for sm_90 (and sm_80), here, with no GPU.

Why: the interpreter tests (test_gpu_kernels.py) check what the kernels compute, not what they
cost, and no GPU is lent to CI. A tile that spills registers to local memory still computes the
right answer, only slowly, so it would pass every other test. triton's wheel bundles ptxas and
compiling to a cubin needs no driver, so this compiles the launched specialisations (the real
wrappers' arguments, see scripts/triton_report.py) and asserts a cubin comes out and that the
kernels on the per-step path (tree attention, the acceptance walks, the invariant linears and
RMSNorm) spill nothing, and that the linears' products are tensor-core instructions.

The compiles run in a child process: this test package's conftest imports ``triton.language`` in
interpreter mode, and an interpreted standard library cannot be compiled. Compiled kernels are
cached under .pytest_cache (triton's cache key includes the kernel source), so a rerun takes a
few seconds; a cold run of the matrix is about 20 s on two cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "triton_report.py"


def _report_module() -> ModuleType:
    """scripts/triton_report.py as a module (it imports neither triton nor torch at load)."""
    spec = importlib.util.spec_from_file_location("triton_report", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("triton_report", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


report = _report_module()
MATRIX = [(case.id, arch) for case, arch in report.smoke_cases()]


@pytest.fixture(scope="module")
def compiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[tuple[str, int], dict[str, Any]]:
    """Every case of the matrix compiled once, in one child process: {(case id, arch): result}."""
    reason = report.missing_toolchain()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # pytest's cache when it is on (a rerun is quick); a temporary folder under -p no:cacheprovider
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("triton-aot-cache") if cache is not None else tmp_path_factory.mktemp("triton-aot-cache")
    env["TRITON_CACHE_DIR"] = str(folder)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json"], cwd=SCRIPT.parent.parent, env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"triton_report.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if rows and "skip" in rows[0]:
        pytest.skip(rows[0]["skip"])
    return {(row["id"], row["arch"]): row for row in rows}


def test_matrix_covers_every_kernel() -> None:
    kernels = {case.kernel for case, _ in report.smoke_cases()}
    assert kernels == {"tree_attention", "tree_attention_combine", "greedy_walk", "sampling_walk", "kv_compact",
                       "invariant_linear", "rms_norm"}
    assert set(report.HOT) <= kernels
    dtypes = {(case.kernel, case.dtype) for case, _ in report.smoke_cases()}
    assert {("tree_attention", "bf16"), ("tree_attention", "fp32")} <= dtypes


@pytest.mark.parametrize(("case_id", "arch"), MATRIX, ids=[f"sm{a}-{c}" for c, a in MATRIX])
def test_kernel_compiles_without_spills(compiled: dict[tuple[str, int], dict[str, Any]], case_id: str, arch: int,
                                        record_property: Any) -> None:
    result = compiled[(case_id, arch)]
    record_property("registers", result["registers"])
    record_property("spill_bytes", result["spill_stores"] + result["spill_loads"])
    print(f"{case_id} sm_{arch}: {result['registers']} registers, {result['num_warps']} warps, "
          f"spills {result['spill_stores']}/{result['spill_loads']} B, shared {result['shared']} B")
    assert result["cubin_bytes"] > 0
    assert 0 < result["registers"] <= 255
    if result["hot"]:
        assert result["spill_stores"] == 0 and result["spill_loads"] == 0, (
            f"{case_id} on sm_{arch} spills {result['spill_stores']} B stored / {result['spill_loads']} B loaded "
            f"per thread ({result['registers']} registers, {result['num_warps']} warps, tile {result['block']}): "
            "see scripts/triton_report.py")
    if result["kernel"] == "invariant_linear":  # bf16 products on the tensor cores (wgmma / mma.sync), not FFMA
        assert result["ptx_mma"] > 0 and result["sass_ffma"] <= 0, f"{case_id} on sm_{arch}: no tensor-core dot"
