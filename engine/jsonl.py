"""Reading JSON-lines files: prompt sets, traces, saved conversations, training prompts.

One reader so every file of ours fails the same way: a missing file, a line that is not JSON
or not an object, each named with its path and line number as one line a user can act on.
Files we append to as we go (saved conversations, traces) can be cut short by a crash while a
line was being written; ``tolerant=True`` keeps every complete record and counts what it
dropped, so the caller can say so instead of refusing the whole file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import MissingFileError, UserError


class JsonLinesError(UserError, ValueError):
    """A JSON-lines file we cannot read; the message names the file and the line."""


@dataclass(frozen=True)
class JsonLines:
    """The objects of a file with their 1-based line numbers, and how many lines were dropped."""

    path: Path
    rows: list[tuple[int, dict[str, Any]]]
    dropped: int = 0


def read_jsonl(path: str | Path, *, tolerant: bool = False) -> JsonLines:
    """Every non-blank line of ``path`` as a JSON object.

    Strict (the default): the first bad line raises :class:`JsonLinesError`. Tolerant: bad lines
    (a record cut by a crash, a stray byte) are skipped and counted in ``dropped``.
    """
    p = Path(path)
    if p.exists() and not p.is_dir() and not p.is_file():  # a FIFO or a device: reading it blocks or never ends
        raise JsonLinesError(f"{p}: not a regular file (a pipe or a device); name a JSON-lines file")
    try:
        text = p.read_text(encoding="utf-8", errors="strict" if not tolerant else "replace")
    except FileNotFoundError:
        raise MissingFileError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise JsonLinesError(f"{p}: is a folder, not a JSON-lines file") from None
    except UnicodeDecodeError as exc:
        raise JsonLinesError(f"{p}: not a UTF-8 text file ({exc.reason})") from None
    except OSError as exc:
        raise JsonLinesError(f"{p}: cannot read ({exc.strerror})") from None
    rows: list[tuple[int, dict[str, Any]]] = []
    dropped = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            if tolerant:
                dropped += 1
                continue
            raise JsonLinesError(
                f"{p}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
        if not isinstance(value, dict):
            if tolerant:
                dropped += 1
                continue
            raise JsonLinesError(f"{p}:{lineno}: not a JSON object; each line must be one JSON object")
        rows.append((lineno, value))
    return JsonLines(p, rows, dropped)
