"""engine.models.checkpoint: loading weights and config, and the one-line errors for bad folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.models.checkpoint import CheckpointError, load_state_dict, read_config


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(11, 4, generator=g),
        "model.norm.weight": torch.randn(4, generator=g),
        "lm_head.weight": torch.randn(11, 4, generator=g),
    }


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# config ------------------------------------------------------------------------------------
def test_read_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 4}))
    assert read_config(tmp_path) == {"model_type": "llama", "hidden_size": 4}


def test_read_config_missing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"has no config\.json"):
        read_config(tmp_path)


def test_read_config_invalid_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama",\n "hidden_size": }')
    with pytest.raises(CheckpointError, match=r"not valid JSON \(line 2, column"):
        read_config(tmp_path)


def test_read_config_not_an_object(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="JSON object"):
        read_config(tmp_path)


# safetensors -------------------------------------------------------------------------------
def test_single_safetensors(tmp_path: Path) -> None:
    state = _tensors()
    save_file(state, str(tmp_path / "model.safetensors"))
    _assert_same(load_state_dict(tmp_path), state)


def test_sharded_safetensors(tmp_path: Path) -> None:
    state = _tensors()
    names = list(state)
    save_file({k: state[k] for k in names[:2]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: state[k] for k in names[2:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {k: f"model-0000{1 if i < 2 else 2}-of-00002.safetensors" for i, k in enumerate(names)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _assert_same(load_state_dict(tmp_path), state)


def test_missing_shard(tmp_path: Path) -> None:
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    save_file({"a": torch.zeros(1)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=r"missing 1 weight shard.*model-00002-of-00002"):
        load_state_dict(tmp_path)


def test_invalid_index(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_state_dict(tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_safetensors(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "model.safetensors"
    save_file(_tensors(), str(path))
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) - 40])
    elif damage == "garbage":
        path.write_bytes(b"\x93NUMPY garbage" * 10)
    else:
        path.write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is not a valid safetensors file \(.+\); re-download or re-convert"):
        load_state_dict(tmp_path)


def test_no_weights(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"has no model\.safetensors"):
        load_state_dict(tmp_path)


def test_oddly_named_safetensors_gets_a_hint(tmp_path: Path) -> None:
    save_file(_tensors(), str(tmp_path / "consolidated.safetensors"))
    with pytest.raises(CheckpointError, match=r"found consolidated\.safetensors"):
        load_state_dict(tmp_path)


def test_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a folder"):
        load_state_dict(tmp_path / "nope")


# pickle ------------------------------------------------------------------------------------
@pytest.mark.parametrize("filename", ["pytorch_model.bin", "weights.pt"])
def test_pickle_refused_by_default(tmp_path: Path, filename: str) -> None:
    torch.save(_tensors(), tmp_path / filename)
    with pytest.raises(CheckpointError, match=r"--allow-pickle.*safetensors") as info:
        load_state_dict(tmp_path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("filename", ["pytorch_model.bin", "weights.pt"])
def test_pickle_allowed(tmp_path: Path, filename: str) -> None:
    state = _tensors()
    torch.save(state, tmp_path / filename)
    _assert_same(load_state_dict(tmp_path, allow_pickle=True), state)


def test_pickle_wrapped_state_dict(tmp_path: Path) -> None:
    state = _tensors()
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "pytorch_model.bin")
    _assert_same(load_state_dict(tmp_path, allow_pickle=True), state)


class _NotATensor:
    pass


def test_pickle_with_arbitrary_objects_is_refused(tmp_path: Path) -> None:
    torch.save({"weight": torch.zeros(2), "evil": _NotATensor()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="weights-only"):
        load_state_dict(tmp_path, allow_pickle=True)


def test_several_pickles_are_ambiguous(tmp_path: Path) -> None:
    torch.save(_tensors(), tmp_path / "a.pt")
    torch.save(_tensors(), tmp_path / "b.pt")
    with pytest.raises(CheckpointError, match="several pickle files"):
        load_state_dict(tmp_path, allow_pickle=True)


def test_safetensors_preferred_over_pickle(tmp_path: Path) -> None:
    state = _tensors(1)
    save_file(state, str(tmp_path / "model.safetensors"))
    torch.save(_tensors(2), tmp_path / "pytorch_model.bin")
    _assert_same(load_state_dict(tmp_path), state)
