"""engine/prompts.py: one prompt-file parser for bench and train-draft, failing the same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import MissingFileError, UserError
from engine.prompts import Prompt, PromptFileError, load_prompts
from engine.train.data import builtin_prompt_file, load_prompt_list


def _write(path: Path, *rows: object) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_bench_and_training_read_a_file_alike(tmp_path: Path) -> None:
    f = _write(tmp_path / "p.jsonl",
               {"id": "a", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
               {"question_id": 81, "turns": ["first", "second"]},
               {"prompt": "raw text"},
               {"messages": [{"role": "system", "content": "only a system turn"}]})
    prompts = load_prompts(f)
    assert [p.id for p in prompts] == ["a", "81", "3", "4"]
    assert prompts[2] == Prompt("3", text="raw text")
    # training regenerates the answer: conversations end on their last user turn; raw text is one
    assert load_prompt_list(f) == [[{"role": "user", "content": "x"}], [{"role": "user", "content": "first"}],
                                   [{"role": "user", "content": "raw text"}]]


@pytest.mark.parametrize("line,needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"turns": [3]}), "'turns' must be"),
    (json.dumps({"messages": [{"role": "user"}]}), "'messages' must be"),
    (json.dumps({"text": "hi"}), "no 'messages', 'turns' or 'prompt'"),
])
def test_a_bad_line_is_named_for_both_readers(tmp_path: Path, line: str, needle: str) -> None:
    f = _write(tmp_path / "p.jsonl", {"prompt": "ok"}, line)
    for read in (load_prompts, load_prompt_list):
        with pytest.raises(PromptFileError, match=rf"p\.jsonl:2: .*{needle}"):
            read(f)
    assert issubclass(PromptFileError, UserError)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    for read in (load_prompts, load_prompt_list):
        with pytest.raises(MissingFileError):
            read(tmp_path / "nope.jsonl")
        with pytest.raises(PromptFileError, match="holds no prompts"):
            read(_write(tmp_path / "empty.jsonl", ""))


def test_the_builtin_training_prompts_parse() -> None:
    assert len(load_prompt_list(builtin_prompt_file())) == len(load_prompts(builtin_prompt_file())) > 50
