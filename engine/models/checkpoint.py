"""Read a model folder's config and weights, refusing what is unsafe or broken with one clear line.

Weights are safetensors by default. Pickle checkpoints (``pytorch_model.bin``, ``*.pt``) can run
arbitrary code when unpickled, so they load only when the user opts in (``--allow-pickle``) and
even then through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from engine.errors import UserError

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"


class CheckpointError(UserError, RuntimeError):
    """A model folder whose config or weights cannot be loaded; the message says what to do."""


def read_config(folder: Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a model folder."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder} has no config.json; pass a model folder (config.json + model.safetensors)")
    return _load_json(path, "config file")


def load_state_dict(
    folder: Path, *, allow_pickle: bool = False, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """All weight tensors of a model folder, keyed by parameter name, on ``device``.

    Looks for ``model.safetensors``, then a sharded ``model.safetensors.index.json``, then (only
    with ``allow_pickle``) ``pytorch_model.bin`` / its index / a single ``*.pt``/``*.pth``/``*.bin``.
    """
    pickled, files = weight_files(folder, allow_pickle=allow_pickle)
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(_load_pickle(path, device) if pickled else _load_safetensors(path, device))
    return state


def read_state_header(folder: Path, *, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """What :func:`load_state_dict` would return, as ``meta`` tensors (names, shapes, dtypes, no
    data) read from the safetensors headers: enough to check a draft head's fit before the target
    loads, at the cost of a few kilobytes. The same refusals (no weights, a pickle without
    ``allow_pickle``, a damaged file); a pickle the user allowed is loaded, as it has no header."""
    pickled, files = weight_files(folder, allow_pickle=allow_pickle)
    if pickled:
        return {k: v.to("meta") for path in files for k, v in _load_pickle(path, "cpu").items()}
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(safetensors_header(path))
    return state


def safetensors_header(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file as ``meta`` tensors (its header only); CheckpointError
    for a file that is not one."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: torch.empty(f.get_slice(k).get_shape(), device="meta") for k in f.keys()}  # noqa: SIM118
    except OSError as e:
        raise CheckpointError(f"cannot read {path} ({e.strerror or e})") from e
    except Exception as e:  # SafetensorError comes from Rust without a stable base class
        raise CheckpointError(f"{path} is not a valid safetensors file ({_reason(e)}); re-download or re-convert "
                              "it") from e


def weight_files(folder: Path, *, allow_pickle: bool = False) -> tuple[bool, list[Path]]:
    """(pickled, the files holding a model folder's weights), in :func:`load_state_dict`'s order
    of preference; CheckpointError (one line) for a folder without weights, or with only pickle
    weights and no ``allow_pickle``. Reads no weights: called before the target loads too."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder")
    if (folder / SAFETENSORS_FILE).is_file():
        return False, [folder / SAFETENSORS_FILE]
    if (folder / SAFETENSORS_INDEX).is_file():
        return False, _shards(folder / SAFETENSORS_INDEX)
    pickles = _pickle_files(folder)
    if not pickles:
        singles = sorted(p.name for p in folder.glob("*.safetensors"))
        hint = f" (found {', '.join(singles[:3])}: rename the model's file to {SAFETENSORS_FILE})" if singles else ""
        raise CheckpointError(f"{folder} has no {SAFETENSORS_FILE} or {SAFETENSORS_INDEX}{hint}")
    if not allow_pickle:
        raise CheckpointError(
            f"{folder} has only pickle weights ({pickles[0].name}), which can run code when loaded; "
            "pass --allow-pickle if you trust the source, or convert them to safetensors"
        )
    return True, pickles


# helpers ----------------------------------------------------------------------------------
def _load_json(path: Path, what: str) -> dict[str, Any]:
    """A model's or a head's JSON file (config.json, a weight index), read bounded (engine/files.py)."""
    from engine.files import JSON_LIMIT, UnreadableFileError, read_text
    from engine.jsonl import loads

    try:
        data = loads(read_text(path, limit=JSON_LIMIT, what=f"a {what}"))
    except UnreadableFileError as e:
        raise CheckpointError(f"{what} {e}") from None
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{what} {path} is not UTF-8 text ({e.reason}); re-download it") from e
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{what} {path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); re-download it"
        ) from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} {path} must hold a JSON object, not {type(data).__name__}")
    return data


def _load_safetensors(path: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=str(device))
    except OSError as e:
        raise CheckpointError(f"cannot read {path} ({e.strerror or e})") from e
    except Exception as e:  # SafetensorError and friends come from Rust without a stable base class
        raise CheckpointError(f"{path} is not a valid safetensors file ({_reason(e)}); re-download or re-convert "
                              "it") from e


def _reason(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _shards(index_path: Path) -> list[Path]:
    index = _load_json(index_path, "weight index")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"weight index {index_path} has no weight_map; re-download it")
    shards = [index_path.parent / name for name in dict.fromkeys(weight_map.values())]
    missing = [p.name for p in shards if not p.is_file()]
    if missing:
        raise CheckpointError(
            f"{index_path.parent} is missing {len(missing)} weight shard(s) listed in {index_path.name} "
            f"({', '.join(missing[:3])}); re-download the model"
        )
    return shards


def _pickle_files(folder: Path) -> list[Path]:
    if (folder / PICKLE_FILE).is_file():
        return [folder / PICKLE_FILE]
    if (folder / PICKLE_INDEX).is_file():
        return _shards(folder / PICKLE_INDEX)
    candidates = sorted(p for ext in ("*.pt", "*.pth", "*.bin") for p in folder.glob(ext) if p.is_file())
    if len(candidates) > 1:
        names = ", ".join(p.name for p in candidates[:4])
        raise CheckpointError(
            f"{folder} has several pickle files ({names}) and no index; name the model's weights {PICKLE_FILE}"
        )
    return candidates


def _load_pickle(path: Path, device: str | torch.device) -> dict[str, torch.Tensor]:
    try:
        obj = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # UnpicklingError, RuntimeError, EOFError, zipfile errors ...
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(
            f"{path} could not be loaded as a weights-only checkpoint ({reason}); convert it to safetensors"
        ) from e
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]  # training checkpoints wrap the weights
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} does not hold a plain dict of tensors; convert it to safetensors")
    return obj
