"""The shared JSON-lines reader: one-line errors with file and line, and torn tails recovered."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import MissingFileError, UserError
from engine.jsonl import JsonLinesError, read_jsonl


def test_objects_come_back_with_their_line_numbers(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n\n{"b": 2}\n', encoding="utf-8")
    got = read_jsonl(p)
    assert got.rows == [(1, {"a": 1}), (3, {"b": 2})]
    assert got.dropped == 0


def test_a_bad_line_names_the_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n{"b": \n', encoding="utf-8")
    with pytest.raises(JsonLinesError, match=r"a\.jsonl:2: not valid JSON"):
        read_jsonl(p)
    p.write_text('{"a": 1}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(JsonLinesError, match=r"a\.jsonl:2: not a JSON object"):
        read_jsonl(p)


def test_a_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError, match="no such file") as info:
        read_jsonl(tmp_path / "nope.jsonl")
    assert isinstance(info.value, UserError) and isinstance(info.value, FileNotFoundError)
    with pytest.raises(JsonLinesError, match="is a folder"):
        read_jsonl(tmp_path)


def test_tolerant_reading_keeps_every_complete_record_of_a_torn_file(tmp_path: Path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n{"b": 2}\n{"c": [1, 2', encoding="utf-8")  # a crash mid-write
    got = read_jsonl(p, tolerant=True)
    assert [row for _, row in got.rows] == [{"a": 1}, {"b": 2}]
    assert got.dropped == 1
