"""Files a command writes where the user said: checked before any work, written whole or not at all.

Why one module: ``bench --json`` / ``--plot``, ``tune --json`` / ``--save-settings``, ``run --record``
and the chat's exports each decided on their own whether an existing file could go (by its
extension or its shape: any JSON, any SVG, any trace), so ``bench --json notes.json`` replaced
the user's notes and ``run --record`` an earlier session's trace without a word; a write failed
half-way (a full disk) with a traceback, after the whole run, leaving a 0-byte file. Here each
output is declared once, as an :class:`Output` (command, flag, kind), and:

- :meth:`Output.check` runs before the model loads: the path names a file, not a folder (an
  existing one, or one spelt with a trailing ``/``); its folder exists (it is made) and can be
  written; an existing file is a regular one, and is replaced only when it is empty, when the
  user passed ``--force``, or when it is provably this output's own earlier file: it carries the
  mark (:data:`WRITTEN_BY`) that :meth:`Output.mark_json` / :meth:`Output.mark_svg` put in,
  checked strictly (the exact value, in a bounded read). A trace has no such pass ("unique"):
  a recorded session cannot be made again.
- :func:`write_whole` writes a temporary file in the same folder and renames it over the target
  (``os.replace``): a failure (ENOSPC) is one line, and an earlier file stays intact.

It sits in ``engine`` (not ``specchat``) because train-draft's output folder check
(engine/train/outdir.py) words its refusals the same way and the engine may not import the app.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.errors import UserError
from engine.files import UnreadableFileError, file_kind, open_regular
from engine.jsonl import loads

WRITTEN_BY = "written_by"  # the key (JSON) / comment word (SVG) that marks a file as specchat's own output
MARK_CAP = 64 * 2**20  # bytes of an existing file read to find its mark (a report is a few MB at most)
SVG_MARK_CAP = 200  # bytes: the SVG's mark is its first line
FORCE_HINT = "add --force to replace it, or name a new file"

Kind = Literal["json", "svg", "unique"]  # "unique": no mark; never replaced without --force (a trace)


class OutputError(UserError):
    """An output path that cannot be written, or that names a file the user did not ask to replace."""


@dataclass(frozen=True)
class Output:
    """One file a command writes: the command and flag naming it, and how its own earlier file is marked.

    Declared once per output (``BENCH_JSON = Output("bench", "--json", "json")``); the mark's value
    names both, so a tune report never passes for tune's settings file."""

    command: str
    flag: str
    kind: Kind
    example: str = "out.json"  # a file name suggested when the path names a folder

    @property
    def mark(self) -> str:
        return f"specchat {self.command} {self.flag}"

    def mark_json(self, report: dict[str, Any]) -> dict[str, Any]:
        """``report`` with its mark first: a later run of the same command may replace the file."""
        return {WRITTEN_BY: self.mark, **report}

    def mark_svg(self, svg: str) -> str:
        """``svg`` with its mark as an XML comment on the first line (before the root element: still an image)."""
        return f"<!-- {WRITTEN_BY} {self.mark} -->\n{svg}"

    def owns(self, path: Path) -> bool:
        """Whether the existing file ``path`` is provably this output's own earlier one: for JSON one object
        whose mark is exactly ours, for SVG a first line that is exactly our mark (bounded reads)."""
        try:
            with open(open_regular(path), "rb") as file:  # non-blocking open, checked on its descriptor
                if self.kind == "svg":
                    return file.readline(SVG_MARK_CAP) == self.mark_svg("").encode()
                if self.kind == "json":
                    data = loads(file.read(MARK_CAP + 1)[:MARK_CAP].decode())
                    return isinstance(data, dict) and data.get(WRITTEN_BY) == self.mark
        except (OSError, ValueError, UnreadableFileError):  # unreadable, not UTF-8, not JSON, swapped for a FIFO
            pass
        return False

    def check(self, path: str | os.PathLike[str], *, force: bool = False) -> Path:
        """Refuse, in one line (OutputError), a path that cannot be written or would replace a file the
        user did not ask to replace; make its folder. Call before any model loads.

        Replaced: an empty file, any regular file with ``force``, this output's own earlier file
        (:meth:`owns`). Never: a folder (also one spelt ``newdir/``), a FIFO or a device."""
        raw = os.fspath(path)
        flag = self.flag
        target = Path(raw)
        if raw.endswith(("/", os.sep)) or target.is_dir():
            raise OutputError(f"{flag} {raw} is a folder; name a file (e.g. {target / self.example})")
        parent = target.parent
        blocker = next((p for p in (parent, *parent.parents) if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise OutputError(f"{flag} {raw}: {blocker} is a file, not a folder")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{flag} {raw}: cannot create the folder {parent} ({exc.strerror or exc})") from None
        _probe(parent, target, flag, raw)
        try:
            info = target.stat()
        except FileNotFoundError:
            return target  # a new file (or a dangling link: its target is made)
        except OSError as exc:
            raise OutputError(f"{flag} {raw}: cannot look at it ({exc.strerror or exc}); name another file") from None
        if not stat.S_ISREG(info.st_mode):  # a FIFO, a device: never opened, never replaced
            raise OutputError(f"{flag} {raw}: not a regular file ({file_kind(info.st_mode)}); name a file to write")
        if info.st_size == 0 or force or (self.kind != "unique" and info.st_size <= MARK_CAP and self.owns(target)):
            return target
        whose = "" if self.kind == "unique" else f" and was not written by {self.mark}"
        raise OutputError(f"{flag} {raw}: that file exists{whose}; {FORCE_HINT}")

    def write(self, path: str | os.PathLike[str], text: str) -> Path:
        """Write ``text`` to ``path`` whole or not at all (see :func:`write_whole`), refusals naming the flag."""
        return write_whole(path, text, self.flag)

    def write_json(self, path: str | os.PathLike[str], data: dict[str, Any], **dumps: Any) -> Path:
        """``data``, marked as this output's (:meth:`mark_json`), as indented JSON (``dumps``: json.dumps's)."""
        return self.write(path, json.dumps(self.mark_json(data), indent=2, **dumps) + "\n")


def check_outputs(named: Sequence[tuple[Output, str | None]], *, force: bool = False) -> None:
    """:meth:`Output.check` for each output a command was given (None: not given), and no two naming one
    file (``tune --json x.json --save-settings x.json`` would keep only the last written)."""
    seen: dict[str, str] = {}
    for output, path in named:
        if not path:
            continue
        where = os.path.realpath(output.check(path, force=force))
        if where in seen:
            raise OutputError(f"{seen[where]} and {output.flag} {path} name the same file; name two different files")
        seen[where] = f"{output.flag} {path}"


def _part(target: Path) -> Path:
    """The temporary file beside ``target`` that :func:`write_whole` renames over it."""
    return target.with_name(f".{target.name}.{os.getpid()}.part")


def _probe(parent: Path, target: Path, flag: str, raw: str) -> None:
    """Create and remove the very temporary file the write will use: the permission bits are not enough
    (even root cannot create a file in /proc; a read-only mount)."""
    part = _part(target)
    try:
        os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(part)
    except OSError as exc:
        raise OutputError(f"{flag} {raw}: cannot write a file in {parent} ({exc.strerror or exc}); "
                          "name another place") from None


def write_whole(path: str | os.PathLike[str], text: str, flag: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all: a temporary file in the same folder, synced, then
    renamed over the target (a link is followed: its target is replaced, with its permissions). Raises
    OutputError in one line when the write fails (a full disk): the temporary file is removed and an
    earlier file is left as it was. ``flag``: the option named first in that line ("": none). Returns ``path``."""
    target = Path(os.path.realpath(path))
    tmp = _part(target)
    try:
        old_mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except OSError:
        old_mode = None
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # the umask applies, as for open()
        with os.fdopen(fd, "wb") as file:
            file.write(text.encode("utf-8"))
            file.flush()
            os.fsync(file.fileno())  # a full disk (or a quota, NFS) may answer only here, or at close
        if old_mode is not None:
            os.chmod(tmp, old_mode)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        left = "the earlier file is left as it was" if old_mode is not None else "nothing was written"
        where = f"{flag} {os.fspath(path)}" if flag else os.fspath(path)
        raise OutputError(f"{where}: cannot write it ({exc.strerror or exc}); {left}") from None
    return Path(path)
