"""Files checked before the target loads (engine/preflight.py): each mistake refused in one line,
and the model loader never called (it is replaced by one that fails the test)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from heads import write_head, write_random_drafts, write_tiny_model

from specchat.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path], Path]:
    root = tmp_path_factory.mktemp("preflight")
    model = write_tiny_model(root / "model")
    wide = write_tiny_model(root / "wide", hidden=64, intermediate=128)
    drafts = write_random_drafts(model, root / "drafts", draft_vocab=200)
    wide_head = write_head(root / "wide-head", json.loads((wide / "config.json").read_text()), "eagle3",
                           draft_vocab=200)
    return model, drafts, wide_head


@pytest.fixture
def no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any command reads a target model."""
    import engine.loader
    import engine.train.pipeline

    def refuse(*args, **kwargs):
        raise AssertionError("the target model was loaded before the files were checked")

    monkeypatch.setattr(engine.loader, "load_model", refuse)
    monkeypatch.setattr(engine.train.pipeline, "load_target", refuse)


def _refused(capsys, argv: list[str], *needles: str) -> str:
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("specchat: error:"), err
    for needle in needles:
        assert needle in err[0], err[0]
    return err[0]


def _gen(model: Path, *flags: str) -> list[str]:
    return ["generate", str(model), "--prompt", "hi", "--max-new-tokens", "4", *flags]


def test_a_head_of_another_width_is_refused_before_loading(tiny, no_load, capsys) -> None:
    model, _, wide_head = tiny
    _refused(capsys, _gen(model, "--draft", str(wide_head)), "hidden size 64", "the target has 32")


def test_a_pickle_without_allow_pickle_is_refused_before_loading(tiny, no_load, capsys, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    model, drafts, _ = tiny
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    torch.save(load_file(str(drafts["eagle"] / "model.safetensors")), pickled / "pytorch_model.bin")
    (pickled / "config.json").write_text((drafts["eagle"] / "config.json").read_text())
    _refused(capsys, _gen(model, "--draft", str(pickled)), "--allow-pickle")


def test_draft_kind_and_missing_draft_are_refused_before_loading(tiny, no_load, capsys, tmp_path: Path) -> None:
    model, drafts, _ = tiny
    _refused(capsys, _gen(model, "--method", "eagle3"), "needs --draft")
    _refused(capsys, _gen(model, "--draft", str(tmp_path / "nope")), "no such file")
    _refused(capsys, _gen(model, "--method", "eagle", "--draft", str(drafts["eagle3"])), "--method eagle3")
    _refused(capsys, _gen(model, "--method", "eagle3", "--draft", str(drafts["standalone"])), "full language model")


def test_a_missing_corpus_or_token_map_is_refused_before_loading(tiny, no_load, capsys, tmp_path: Path) -> None:
    model, drafts, _ = tiny
    _refused(capsys, _gen(model, "--ngram-corpus", str(tmp_path / "no-corpus")), "no batch-*.npz")
    _refused(capsys, _gen(model, "--draft", str(drafts["eagle"]), "--speculative-token-map",
                          str(tmp_path / "map.json")), "token map", "does not exist")
    bad_map = tmp_path / "bad.json"
    bad_map.write_text(json.dumps([1, 2, 100000]))
    _refused(capsys, _gen(model, "--draft", str(drafts["eagle"]), "--speculative-token-map", str(bad_map)),
             "outside the target vocabulary")


@pytest.mark.parametrize("command", ["run", "bench", "tune", "serve"])
def test_every_loading_command_checks_first(tiny, no_load, capsys, tmp_path: Path, monkeypatch, command: str
                                            ) -> None:
    """The check runs before the command itself (which would open the TUI or start a server)."""
    import specchat.cli

    def command_ran(args):
        raise AssertionError(f"{command} started before its files were checked")

    monkeypatch.setitem(specchat.cli.COMMANDS, command, (__name__, "_never"))
    monkeypatch.setattr(f"{__name__}._never", command_ran, raising=False)
    model, _, wide_head = tiny
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    extra = ["--prompts", str(prompts), "--methods", "eagle3"] if command in ("bench", "tune") else []
    _refused(capsys, [command, str(model), "--draft", str(wide_head), *extra], "hidden size 64")


def test_bad_settings_and_prompt_folders_are_refused_before_loading(tiny, no_load, capsys, tmp_path: Path) -> None:
    model, _, _ = tiny
    settings = tmp_path / "s.json"
    settings.write_text("{not json")
    _refused(capsys, _gen(model, "--settings", str(settings)), "not JSON")
    folder = tmp_path / "a-folder"
    folder.mkdir()
    argv = ["generate", str(model), "--prompt-file", str(folder)]
    _refused(capsys, argv, "is a folder")


@pytest.mark.parametrize("change", [{"hidden_size": 0}, {"num_hidden_layers": -2}, {"num_attention_heads": 0},
                                    {"vocab_size": 0}, {"num_attention_heads": 5}, {"num_key_value_heads": 3},
                                    {"intermediate_size": 0}, {"hidden_size": "wide"}])
def test_nonsense_config_values_are_refused_in_one_line(tiny, no_load, capsys, tmp_path: Path, change) -> None:
    model, _, _ = tiny
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in model.iterdir():
        (broken / f.name).symlink_to(f)
    (broken / "config.json").unlink()
    (broken / "config.json").write_text(json.dumps({**json.loads((model / "config.json").read_text()), **change}))
    line = _refused(capsys, _gen(broken), "config.json")
    assert "precision" not in line


def test_nonsense_config_never_falls_back_to_transformers(tiny, capsys, tmp_path: Path) -> None:
    """Through the loader itself (no pre-flight): the damaged config is named, not handed to --backend hf."""
    from engine.loader import load_model
    from engine.models.llama_config import ModelConfigError

    model, _, _ = tiny
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in model.iterdir():
        (broken / f.name).symlink_to(f)
    (broken / "config.json").unlink()
    (broken / "config.json").write_text(json.dumps({**json.loads((model / "config.json").read_text()),
                                                    "hidden_size": 0}))
    with pytest.raises(ModelConfigError, match="hidden_size must be > 0"):
        load_model(str(broken), threads=1)


def _hostile_gguf(path: Path, n_tensors: int = 2**40, n_kv: int = 0) -> Path:
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + b"\0" * 64)
    return path


def test_a_gguf_header_claiming_2_40_tensors_is_refused(no_load, capsys, tmp_path: Path) -> None:
    gguf = _hostile_gguf(tmp_path / "evil.gguf")
    _refused(capsys, _gen(gguf), "not a valid GGUF file", str(2**40))
    _refused(capsys, _gen(_hostile_gguf(tmp_path / "evil2.gguf", n_tensors=0, n_kv=2**60)), "not a valid GGUF file")


def test_the_gguf_reader_and_converter_bound_the_header(tmp_path: Path, monkeypatch) -> None:
    from engine.models.gguf_file import GGUFFormatError, read_gguf
    from engine.models.resolve import ModelResolutionError, resolve_model

    gguf = _hostile_gguf(tmp_path / "evil.gguf")
    with pytest.raises(GGUFFormatError, match="not a valid GGUF file"):
        read_gguf(gguf)
    # a string length past the end of the file
    (tmp_path / "s.gguf").write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**50) + b"\0" * 32)
    with pytest.raises(GGUFFormatError, match="bytes of text"):
        read_gguf(tmp_path / "s.gguf")
    monkeypatch.setenv("SPECCHAT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ModelResolutionError, match="not a valid GGUF file"):
        resolve_model(str(gguf), weights="fp32")


def test_train_draft_on_a_shallow_target_says_how_many_layers(no_load, capsys, tmp_path: Path) -> None:
    shallow = write_tiny_model(tmp_path / "shallow", layers=3)
    _refused(capsys, ["train-draft", str(shallow), "--out", str(tmp_path / "head")], "at least 5 layers",
             "has 3")


def test_the_embedded_model_is_checked_from_its_gguf_header(tiny, no_load, capsys) -> None:
    """The embedded target's widths come from its GGUF header (no conversion, no weights)."""
    _, _, wide_head = tiny
    _refused(capsys, ["generate", "--prompt", "hi", "--draft", str(wide_head)], "hidden size 64",
             "the target has 576")


def test_a_standalone_draft_no_smaller_than_the_target_is_said_in_one_warning(tiny, tmp_path: Path) -> None:
    """Such a draft cannot pay, but the drafting machinery's tests and benchmarks run random drafts
    of that size (tests/heads.py): one warning line from the files, not a refusal."""
    from heads import write_random_standalone

    from engine.preflight import check_files

    model, drafts, _ = tiny
    notes: list[str] = []
    check_files(str(model), method="standalone", draft=str(drafts["standalone"]), warn=notes.append)
    assert len(notes) == 1 and "is no smaller than the target" in notes[0], notes
    small = write_random_standalone(tmp_path / "small", model, layers=1, hidden=16)
    notes.clear()
    check_files(str(model), method="standalone", draft=str(small), warn=notes.append)
    assert notes == []
