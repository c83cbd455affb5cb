"""scripts/device: the lent GPU machine gets one try per session, so its plan is checked here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

DEVICE = Path(__file__).resolve().parent.parent / "scripts" / "device"


def _script_module(name: str):
    """scripts/device/<name>.py imported (the scripts are no package: they travel as files)."""
    spec = importlib.util.spec_from_file_location(name, DEVICE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parts_module():
    return _script_module("gguf_parts")


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


def _install_module():
    return _script_module("install_dflash")


def test_the_dflash_call_runs_dry_and_its_parts_install(tmp_path: Path) -> None:
    """lease15.sh d (the DFlash drafter a lent GPU trains) on the CPU with a tiny model and tiny id
    shards: the target run on each batch (--live-target, the GPU's path), the drafter exported in
    parts with their sha256 and card; install_dflash.py joins them into a folder the DFlash loader
    reads, and refuses a part that does not match."""
    import sys

    import torch
    from heads import write_tiny_model

    from engine.drafters.draft_loader import load_draft
    from engine.kernels import native
    from engine.loader import load_model
    from engine.train.data import DataCache, Sample

    if native.load() is None:
        pytest.skip(f"no native kernel: {native.why_not}")
    model = write_tiny_model(tmp_path / "model", layers=8, vocab=300)
    ids = DataCache(tmp_path / "ids", 300)
    g = torch.Generator().manual_seed(0)
    for shard in range(3):
        ids.write(shard, [Sample(torch.randint(3, 300, (40,), generator=g).tolist(), 8, i % 2 == 0) for i in range(12)],
                  conversations=range(shard * 12, shard * 12 + 12))
    out = tmp_path / "out"
    env = {**os.environ, "PY": sys.executable, "DEVICE": "cpu", "MODEL": str(model), "IMPORT": str(ids.folder),
           "STEPS": "3", "BATCH": "256", "PACK": "256", "EVAL_BLOCKS": "16", "EVAL_EVERY": "2", "THREADS": "1",
           "OUT": str(out), "SPECCHAT_CACHE_DIR": str(tmp_path / "cache"), "SPECCHAT_STASH": str(tmp_path / "stash"),
           "SPECCHAT_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.run(["bash", str(DEVICE / "lease15.sh"), "d"], capture_output=True, text=True, env=env,
                          cwd=DEVICE.parent.parent, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    names = sorted(p.name for p in out.iterdir())
    assert names[:3] == ["drafter-config.json", "drafter-tau.json", "drafter.safetensors.part-aa"]
    assert names[-2:] == ["drafter.sha256", "results-d.tgz"] and len(names) <= 8
    card = json.loads((out / "drafter-config.json").read_text())["specchat_training"]
    total = sum(len(s.ids) - s.answer_start for s in ids.samples())
    assert f"--tokens {total}" in card["command"] and "--live-target" in card["command"]  # all of it, none generated
    assert card["steps"] == 3 and card["settings"]["draft_layers"] == 2 and card["settings"]["pack_rows"] == 256
    assert "computed by the target's forward" in card["target_features"]

    install = _install_module()
    into = tmp_path / "assets" / "dflash"
    install.install(out, into)
    assert sorted(p.name for p in into.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert "2 Qwen3-style layers" in (into / "README.md").read_text()
    bundle = load_draft(str(into), load_model(str(model), threads=1).model, None)
    assert bundle.method == "dflash" and bundle.features.capture_layers == (2, 4, 5)

    part = out / "drafter.safetensors.part-aa"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    with pytest.raises(SystemExit, match="checksum mismatch"):
        install.install(out, tmp_path / "broken")
    assert not any((tmp_path / "broken").iterdir())
