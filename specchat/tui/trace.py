"""Traces: a session's events saved as JSON lines, and read back for replay or to reopen a chat.

Line 1 is a header::

    {"kind": "header", "format": "specchat-trace", "format_version": 1, "specchat_version": "0.1.0",
     "model": "smollm2-135m", "drafter": "ngram", "config": {...SpecConfig.to_dict()...}}

Every following line is one record: an engine event (``event_to_dict``: Started, Step, ConfigApplied,
Finished) or a :class:`UserTurn`, which marks the prompt that the following answer(s) reply to. A
``"compare"`` turn is followed by two answers, the baseline first, then the speculative run.

The replay needs nothing else: events carry decoded text for every token and tree node, and each
step's timing, so the original pacing can be reproduced without a model or a tokenizer.

Why this lives in the app, not the engine: only the app records and replays; the engine yields
events and knows nothing of files of them (and must not import ``specchat``).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from engine.errors import MissingFileError, UserError
from engine.events import Event, Started, event_from_dict, event_to_dict
from engine.jsonl import JsonLinesError, read_jsonl
from engine.outputs import Output
from specchat import __version__
from specchat.tui.trace_types import check_record

FORMAT = "specchat-trace"
FORMAT_VERSION = 1
RECORD = Output("run", "--record", "unique", example="trace.jsonl")  # a trace: replaced only with --force

TurnMode = Literal["chat", "compare"]


class TraceError(UserError, ValueError):
    """A trace file that cannot be read; the message is one line naming the file (and line)."""


@dataclass(frozen=True)
class UserTurn:
    """The user's prompt, recorded before the answer(s) it produced."""

    kind: Literal["user"] = field(default="user", init=False)
    text: str = ""
    mode: TurnMode = "chat"
    methods: tuple[str, ...] = ()  # compare: method A and method B (empty: the baseline vs the method in force)


Record = Event | UserTurn


@dataclass(frozen=True)
class Trace:
    """A trace read back: its header, its records, and how many damaged lines were left out."""

    header: dict[str, Any]
    records: list[Record]
    dropped: int = 0


@dataclass(frozen=True)
class ReplaySource:
    """A recording to play in the app: its header and records, at ``speed`` (``step``: one step per key)."""

    path: str
    header: dict[str, Any]
    records: tuple[Record, ...]
    speed: float = 1.0
    step: bool = False


def make_header(model: str = "", drafter: str = "", config: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "kind": "header",
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "specchat_version": __version__,
        "model": model,
        "drafter": drafter,
        "config": dict(config or {}),
    }


def record_to_dict(record: Record) -> dict[str, Any]:
    if isinstance(record, UserTurn):
        data = asdict(record)
        if record.methods:
            data["methods"] = list(record.methods)
        else:
            del data["methods"]  # chat turns and the default compare read as before
        return data
    return event_to_dict(record)


def record_from_dict(data: dict[str, Any]) -> Record:
    if data.get("kind") == "user":
        methods = data.get("methods") or ()
        return UserTurn(text=str(data.get("text", "")), mode=data.get("mode", "chat"),
                        methods=tuple(str(m) for m in methods) if isinstance(methods, list) else ())
    return event_from_dict(data)


class TraceWriter:
    """Writes records as JSON lines, flushing after each so a crash loses at most one line.

    When the model or drafter name is not given, the header waits for the first ``Started`` event
    (records before it, such as the user's turn, are held until then) and takes the names from it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        model: str = "",
        drafter: str = "",
        config: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self._header = make_header(model, drafter, config)
        self._file: IO[str] | None = None
        self._header_written = False
        self._held: list[Record] = []
        self.records = 0

    def __enter__(self) -> TraceWriter:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("w", encoding="utf-8")

    def write(self, record: Record) -> None:
        if self._file is None:
            self.open()
        if not self._header_written:
            missing = not (self._header["model"] and self._header["drafter"])
            if missing and not isinstance(record, Started):
                # hold records that precede the first answer (the user's turn) until the
                # Started event can name the model and drafter for the header
                self._held.append(record)
                return
            if isinstance(record, Started):
                self._header["model"] = self._header["model"] or record.model
                self._header["drafter"] = self._header["drafter"] or record.drafter
                self._header["config"] = self._header["config"] or dict(record.config)
            self._write_header()
        self._write_line(record_to_dict(record))
        self.records += 1

    def close(self) -> None:
        if self._file is None:
            return
        if not self._header_written:
            self._write_header()
        self._file.close()
        self._file = None

    def abandon(self) -> None:
        """Close the file after a write failed, whatever is left in its buffer: closing still frees the
        descriptor when the flush of that rest fails again (a full disk), and nothing is raised (the
        failure was said when it happened; at quit it would be a traceback)."""
        file, self._file = self._file, None
        if file is None:
            return
        with contextlib.suppress(OSError, ValueError):
            file.close()

    def _write_header(self) -> None:
        self._write_line(self._header)
        self._header_written = True
        held, self._held = self._held, []
        for record in held:
            self._write_line(record_to_dict(record))
            self.records += 1

    def _write_line(self, data: dict[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._file.flush()


def open_trace(path: str | os.PathLike[str], *, tolerant: bool = False) -> Trace:
    """Read a trace; raises :class:`TraceError` with a one-line message.

    ``tolerant``: a line that is not a whole record (the one being written when the app crashed) is
    left out and counted in ``Trace.dropped`` instead of refusing the file; a saved conversation is
    reopened this way. A replay reads strictly: it should play what was recorded or say why not.
    """
    try:
        lines = read_jsonl(Path(path), tolerant=tolerant)
    except (JsonLinesError, MissingFileError) as exc:
        raise TraceError(str(exc)) from None
    if not lines.rows:
        what = "no whole JSON record in it" if lines.dropped else "empty file"
        raise TraceError(f"{lines.path}: {what}, not a specchat trace")
    (_, header), *rest = lines.rows
    _check_header(lines.path, header)
    records: list[Record] = []
    dropped = lines.dropped
    for lineno, data in rest:
        try:
            record = record_from_dict(data)
        except (TypeError, ValueError, KeyError) as exc:
            if tolerant:
                dropped += 1
                continue
            raise _bad_record(lines.path, lineno, data, exc) from None
        try:  # a whole line of the wrong types was edited, not cut by a crash: refused even when tolerant
            check_record(record)
        except TypeError as exc:
            raise _bad_record(lines.path, lineno, data, exc) from None
        records.append(record)
    return Trace(header, records, dropped)


def _bad_record(path: Path, lineno: int, data: dict[str, Any], exc: Exception) -> TraceError:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return TraceError(f"{path}:{lineno}: bad {data.get('kind', '?')!r} record ({reason}); fix or remove that line")


def read_trace(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[Record]]:
    """Read a whole trace strictly: ``(header, records)`` (see :func:`open_trace`)."""
    trace = open_trace(path)
    return trace.header, trace.records


def check_record_path(path: str | os.PathLike[str], *, force: bool = False) -> None:
    """Refuse, in one line, a trace path that cannot be written, before any model loads: a folder, a
    parent folder that cannot be made or written, or an existing file without ``force`` (a recorded
    session cannot be made again: even an earlier trace is replaced only with --force; see
    engine/outputs.py). Without this, ``--record /proc/nope/t.jsonl`` made every answer fail once the
    chat had started, and ``--record`` over yesterday's trace replaced it without a word."""
    RECORD.check(path, force=force)


def _check_header(path: Path, header: dict[str, Any]) -> None:
    if header.get("kind") != "header" or header.get("format") != FORMAT:
        raise TraceError(f"{path}: not a specchat trace (line 1 is not a {FORMAT} header)")
    version = header.get("format_version")
    if version != FORMAT_VERSION:
        raise TraceError(f"{path}: trace format version {version!r}; this specchat reads version {FORMAT_VERSION}")
