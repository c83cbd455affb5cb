"""Reading JSON-lines files: prompt sets, traces, saved conversations, training prompts.

One reader so every file of ours fails the same way: a missing file, a line that is not JSON
or not an object, each named with its path and line number as one line a user can act on.
:func:`loads` is the JSON parser every reader of ours uses (a settings file, a token map, a
model's config.json, each line here): where ``json.loads`` lets a RecursionError (``[[[[...`` nested
100k deep) or a bare ValueError (an integer of 5000 digits, over Python's int-string limit) escape
as a traceback, it raises a ``json.JSONDecodeError`` with the line, like any other bad JSON, so the
callers' own one-line messages cover these too.

Files we append to as we go (saved conversations, traces) can be cut short by a crash while a
line was being written; ``tolerant=True`` keeps every complete record and counts what it
dropped, so the caller can say so instead of refusing the whole file.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import MissingFileError, UserError
from engine.files import JSONL_LIMIT, UnreadableFileError, read_text


class JsonLinesError(UserError, ValueError):
    """A JSON-lines file we cannot read; the message names the file and the line."""


class JsonLimitError(json.JSONDecodeError):
    """Whole JSON beyond what the parser takes (nested too deeply, an integer of too many digits): never a
    line cut short by a crash, so a tolerant reader refuses it too."""


def loads(text: str) -> Any:
    """``json.loads(text)``, every failure a ``json.JSONDecodeError`` (msg, lineno) a message can quote."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise JsonLimitError("arrays or objects nested too deeply", text,
                                   _too_deep_at(text)) from None
    except ValueError as exc:  # the int-string conversion limit (sys.get_int_max_str_digits)
        limit = sys.get_int_max_str_digits()
        digits = re.search(rf"\d{{{limit + 1},}}", text)
        raise JsonLimitError(f"an integer of more than {limit} digits" if digits else str(exc), text,
                                   digits.start() if digits else 0) from None


def _too_deep_at(text: str, depth: int = 500) -> int:
    """Where ``text`` first opens its ``depth``-th nested bracket (outside strings): the place to point at."""
    level, in_string, escaped = 0, False, False
    for pos, ch in enumerate(text):
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            if level >= depth:
                return pos
        elif ch in "]}":
            level -= 1
    return 0


@dataclass(frozen=True)
class JsonLines:
    """The objects of a file with their 1-based line numbers, and how many lines were dropped."""

    path: Path
    rows: list[tuple[int, dict[str, Any]]]
    dropped: int = 0


def read_jsonl(path: str | Path, *, tolerant: bool = False) -> JsonLines:
    """Every non-blank line of ``path`` as a JSON object.

    Strict (the default): the first bad line raises :class:`JsonLinesError`. Tolerant: bad lines
    (a record cut by a crash, a stray byte) are skipped and counted in ``dropped``; a whole line the
    parser cannot take (:class:`JsonLimitError`) was written that way, and is refused either way.
    """
    p = Path(path)
    try:
        text = read_text(p, limit=JSONL_LIMIT, what="a JSON-lines file", errors="strict" if not tolerant else "replace")
    except MissingFileError:
        raise
    except UnreadableFileError as exc:  # a FIFO, a device, a file over the bound
        raise JsonLinesError(str(exc)) from None
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
            value = loads(line)
        except json.JSONDecodeError as exc:
            if tolerant and not isinstance(exc, JsonLimitError):
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
