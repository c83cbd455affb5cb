"""scripts/device: the lent GPU machine gets one try per session, so its plan is checked here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

DEVICE = Path(__file__).resolve().parent.parent / "scripts" / "device"


def _parts_module():
    spec = importlib.util.spec_from_file_location("gguf_parts", DEVICE / "gguf_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parts_round_trip_one_call_at_a_time(tmp_path: Path) -> None:
    parts = _parts_module()
    source = tmp_path / "model.gguf"
    source.write_bytes(os.urandom(100_003))
    carried = tmp_path / "here"
    folders = parts.split(source, 3, carried)
    assert [f.name for f in folders] == ["gguf-1", "gguf-2", "gguf-3"]
    stash = tmp_path / "there"
    for i, folder in enumerate(folders):  # each call carries one part
        call = tmp_path / f"call{i}"
        (call / folder.name).mkdir(parents=True)
        for f in folder.iterdir():
            (call / folder.name / f.name).write_bytes(f.read_bytes())
        got = parts.stash(call, stash)
        assert (got is None) == (i < 2)
    assert got.read_bytes() == source.read_bytes()
    assert parts.stash(tmp_path / "empty", stash) == got  # later calls find it assembled


def test_a_broken_part_is_refused(tmp_path: Path) -> None:
    parts = _parts_module()
    source = tmp_path / "model.gguf"
    source.write_bytes(os.urandom(5000))
    (folder,) = parts.split(source, 1, tmp_path / "here")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "part").write_bytes(b"x" * manifest["size"])
    with pytest.raises(SystemExit, match="checksum mismatch"):
        parts.stash(tmp_path / "here", tmp_path / "there")


@pytest.mark.parametrize("script", sorted(p.name for p in DEVICE.glob("*.sh")))
def test_scripts_parse(script: str) -> None:
    assert subprocess.run(["bash", "-n", str(DEVICE / script)], capture_output=True).returncode == 0


def test_prompt_sets_travel_with_the_plan() -> None:
    for name in ("mt_bench.jsonl", "rewrite.jsonl"):
        lines = (DEVICE / "prompts" / name).read_text().splitlines()
        assert lines and all(json.loads(line) for line in lines)


def test_the_batch_invariance_probe_runs_and_its_kernel_is_invariant() -> None:
    """scripts/device/bi_probe.py (lease15.sh a) under Triton's interpreter with tiny fp32 shapes:
    it runs, its candidate kernel gives every row the bits of the 64-row call and an fp32 product's
    values; torch's own product is not held to that (it is what the probe measures)."""
    import ast
    import os
    import re
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(DEVICE / "bi_probe.py"), "--dry"], capture_output=True, text=True,
                          env=env, cwd=DEVICE.parent.parent, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r"invariant kernel \(split \d\) (\{.*?\}), rel\. error (\S+)", proc.stdout)
    assert found, proc.stdout
    assert set(ast.literal_eval(found.group(1)).values()) == {0}  # {M: differing elements}
    assert float(found.group(2)) < 1e-5


def test_the_check_runs_dry_on_the_cpu_and_writes_one_json(tmp_path: Path) -> None:
    """scripts/device/check.sh (issue 51's one device call) on the CPU: a tiny random shape, the
    embedded model's sections skipped (they need the GGUF and minutes here). Every section is a
    row of check.json, with its exit code, and the bench's JSON under it; the bundle comes back."""
    import sys

    from tests.tiny import family_config

    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(family_config("llama")))
    out = tmp_path / "out"
    env = {**os.environ, "PY": sys.executable, "DEVICE": "cpu", "DRY": "1", "EMBEDDED": "0", "SHAPE": str(config),
           "OUT": str(out), "PYTEST_ARGS": "tests/gpu/test_gpu_static.py -k bucket_choice",
           "SPECCHAT_CACHE_DIR": str(tmp_path / "cache"), "SPECCHAT_STASH": str(tmp_path / "stash")}
    proc = subprocess.run(["bash", str(DEVICE / "check.sh")], capture_output=True, text=True, env=env,
                          cwd=DEVICE.parent.parent, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((out / "check.json").read_text())
    rows = report["sections"]
    assert set(rows) == {"pytest", "random-invariant", "random-cublas", "embedded-mt_bench", "embedded-rewrite",
                         "embedded-standalone", "pilot"}
    assert rows["pytest"]["rc"] == 0
    for linear in ("invariant", "cublas"):
        assert rows[f"random-{linear}"]["rc"] == 0, proc.stdout[-3000:]
        assert rows[f"random-{linear}"]["result"]["cost_curve"]
        assert report["headline"][f"random-{linear}"]["verify_max_over_1"] is not None
    assert rows["pilot"]["rc"] is None and rows["pilot"]["skipped"]
    assert sorted(p.name for p in out.iterdir()) == ["check-files.tgz", "check.json", "check.log"]
