"""engine/files.py: a file the user names is read only when it is a regular file, and only up to a bound."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.errors import MissingFileError
from engine.files import FileTooLargeError, NotRegularFileError, open_regular, read_text
from engine.jsonl import JsonLimitError, loads


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    """The check is made on the descriptor opened with O_NONBLOCK: no window between a stat and a blocking open."""
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFileError, match=r"p: not a regular file \(a named pipe\); name a settings file"):
        open_regular(fifo, what="a settings file")


def test_a_device_a_folder_a_missing_file_and_a_link_to_nothing(tmp_path: Path) -> None:
    with pytest.raises(NotRegularFileError, match=r"/dev/zero: not a regular file \(a device\)"):
        read_text("/dev/zero", limit=10)
    with pytest.raises(IsADirectoryError):
        read_text(tmp_path, limit=10)
    with pytest.raises(MissingFileError, match=r"none: no such file"):
        read_text(tmp_path / "none", limit=10)
    (tmp_path / "link").symlink_to("gone")
    with pytest.raises(MissingFileError, match=r"link: a symbolic link to gone, which does not exist"):
        read_text(tmp_path / "link", limit=10)
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(MissingFileError, match=r"loop: a symbolic link that loops back on itself"):
        read_text(tmp_path / "loop", limit=10)


def test_reads_stop_at_the_bound_and_newlines_read_as_read_text_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a\r\nb\rc")
    assert read_text(path, limit=6) == path.read_text() == "a\nb\nc"
    with pytest.raises(FileTooLargeError, match=r"f: over 5 bytes, too big to be a settings file"):
        read_text(path, limit=5, what="a settings file")


def test_json_the_parser_cannot_take_is_a_json_error_with_its_line() -> None:
    with pytest.raises(JsonLimitError, match="nested too deeply") as deep:
        loads('{"a":\n' + "[" * 100_000)
    assert deep.value.lineno == 2
    with pytest.raises(JsonLimitError, match="an integer of more than 4300 digits") as big:
        loads('{\n\n"n": ' + "9" * 5000 + "}")
    assert big.value.lineno == 3 and isinstance(big.value, json.JSONDecodeError)
    assert loads('{"n": 1.5}') == {"n": 1.5}
