"""Bad input ends with one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.prompts import PromptFileError, load_prompts
from specchat.cli import main


def run_cli(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "specchat.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("specchat: error:")
    for needle in needles:
        assert needle in lines[0]
    assert "Traceback" not in proc.stderr


def test_incomplete_config(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"")
    proc = run_cli("generate", str(folder), "--prompt", "hi")
    assert_one_line_error(proc)


def test_unknown_model(tmp_path: Path) -> None:
    proc = run_cli("generate", "no-such-model", "--prompt", "hi", env_extra={"SPECCHAT_CACHE_DIR": str(tmp_path)})
    assert_one_line_error(proc, "no-such-model")


def test_corrupt_safetensors(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    from tests.tiny import family_config

    (folder / "config.json").write_text(json.dumps(family_config("llama")))
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage")
    proc = run_cli("generate", str(folder), "--prompt", "hi")
    assert_one_line_error(proc, "safetensors")


@pytest.mark.parametrize("flags,needle", [
    (["--speculative-eagle-topk", "0"], "--speculative-eagle-topk: must be an integer from 1 to 64"),
    (["--speculative-num-draft-tokens", "1"], "--speculative-num-draft-tokens: must be an integer from 2 to 64"),
    (["--temperature", "-1"], "--temperature"),
    (["--method", "magic"], "unknown method"),
])
def test_invalid_flag_values(flags: list[str], needle: str, capsys) -> None:
    assert main(["generate", "--prompt", "hi", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_prompt_file_with_a_bad_line(tmp_path: Path, capsys) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ok"}\n{not json}\n')
    with pytest.raises(PromptFileError, match=r"p\.jsonl:2"):
        load_prompts(f)
    assert main(["bench", "--prompts", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "p.jsonl:2" in err[0]


def test_prompt_formats(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join([
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "x"}]}),
        json.dumps({"question_id": 81, "turns": ["first", "second"]}),
        json.dumps({"prompt": "raw text"}),
    ]))
    prompts = load_prompts(f)
    assert [p.id for p in prompts] == ["a", "81", "3"]
    assert prompts[1].messages == [{"role": "user", "content": "first"}]
    assert prompts[2].text == "raw text"
    assert len(load_prompts(f, limit=2)) == 2


def test_shared_bench_files_parse() -> None:
    root = Path(__file__).resolve().parents[2] / "shared" / "bench"
    if not root.is_dir():
        pytest.skip("shared/bench not beside the checkout")
    assert len(load_prompts(root / "mt_bench.jsonl")) == 80
    assert len(load_prompts(root / "rewrite.jsonl")) == 10


def test_help_does_not_import_heavy_modules() -> None:
    code = ("import sys; from specchat.cli import build_parser; build_parser(); "
            "print(any(m in sys.modules for m in ('torch', 'textual', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_raw_prompts_get_the_tokens_the_tokenizer_puts_in_front_once() -> None:
    """``generate --raw``: a BOS-adding tokenizer (Gemma) gets its BOS, not twice when typed, and no
    appended EOS; a tokenizer that adds nothing (SmolLM2) reads the text alone."""
    from specchat.generate import _raw_ids

    class Fake:
        def __init__(self, front: list[int], back: list[int]) -> None:
            self.front, self.back = front, back

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            ids = [1 if c == "^" else ord(c) for c in text]
            return self.front + ids + self.back if add_special_tokens else ids

    assert _raw_ids(Fake([1], []), "ab") == [1, 97, 98]
    assert _raw_ids(Fake([1], []), "^ab") == [1, 97, 98]
    assert _raw_ids(Fake([1], [2]), "ab") == [1, 97, 98]
    assert _raw_ids(Fake([], []), "ab") == [97, 98]
