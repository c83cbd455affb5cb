"""Saved conversations and exports (no Textual imports).

Every chat is recorded as a trace (trace.py: the user's turns and every engine event) under
the user data dir, so it can be reopened later with its draft trees, or replayed. Exports turn what
was said into Markdown (the words) or into an HTML / SVG snapshot with the token colours of the
theme in use (for slides).

Where: ``$SPECCHAT_DATA_DIR`` if set, else platformdirs' user data dir (``~/.local/share/specchat``
on Linux); conversations in ``sessions/``, exports in ``exports/``.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from engine.events import Finished, Started, Step
from engine.files import UnreadableFileError, open_regular
from specchat.tui.trace import Record, Trace, TraceError, UserTurn, open_trace

ENV_VAR = "SPECCHAT_DATA_DIR"
SUMMARY_CAP = 64 * 2**20  # characters of a saved chat read for its line in the list (turns past it are not counted)


def data_dir() -> Path:
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("specchat"))


def sessions_dir() -> Path:
    return data_dir() / "sessions"


def exports_dir() -> Path:
    return data_dir() / "exports"


def new_session_path(now: float | None = None) -> Path:
    """A fresh file name that sorts by time: sessions/2026-11-23_14-05-01.jsonl (suffixed if taken)."""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now))
    folder = sessions_dir()
    path = folder / f"{stamp}.jsonl"
    n = 2
    while path.exists():
        path = folder / f"{stamp}-{n}.jsonl"
        n += 1
    return path


@dataclass(frozen=True)
class SavedSession:
    path: Path
    modified: float
    title: str  # the first message, shortened
    turns: int
    model: str


def _summary(path: Path) -> SavedSession | None:
    """Read only what the list needs: the header and the user turns (quick, never raises, never blocks).

    Why not :func:`open_trace`: steps are most of a file and the list needs none of them, so lines
    without a user turn are skipped unparsed. A line that is not JSON (cut by a crash while it was
    written) is skipped too: the conversation is still listed, and reopening says what was lost.
    Only regular files are read (a FIFO named ``x.jsonl`` froze the app at Ctrl+O: opening it
    waits for a writer), and only their first :data:`SUMMARY_CAP` characters.
    """
    turns = 0
    title = ""
    model = ""
    try:
        info = path.stat()  # follows a link: a link to a FIFO is skipped as the FIFO is
        if not stat.S_ISREG(info.st_mode):
            return None
        with _open_regular(path) as fh:
            head = json.loads(fh.readline(SUMMARY_CAP))
            if not isinstance(head, dict) or head.get("kind") != "header":
                return None
            model = str(head.get("model", ""))
            read = 0
            while read < SUMMARY_CAP and (line := fh.readline(SUMMARY_CAP)):
                read += len(line)
                if '"user"' not in line:  # cheap pre-filter; steps are most of the file
                    continue
                data = _json_object(line)
                if data.get("kind") != "user" or data.get("mode") != "chat":
                    continue
                turns += 1
                if not title:
                    title = " ".join(str(data.get("text", "")).split())
    except (OSError, ValueError):
        return None
    if not turns:
        return None
    return SavedSession(path, info.st_mtime, title[:70] + ("…" if len(title) > 70 else ""), turns, model)


def _open_regular(path: Path) -> TextIO:
    """``path`` opened for reading without blocking (engine/files.py: checked on the descriptor, so a FIFO
    swapped in after the stat cannot block), or OSError when it is not a regular file."""
    try:
        fd = open_regular(path)
    except UnreadableFileError as exc:
        raise OSError(str(exc)) from None
    return open(fd, encoding="utf-8", errors="replace")  # the caller closes it


def _json_object(line: str) -> dict[str, object]:
    """One line as a JSON object, or ``{}`` when it is not one (a damaged line counts for nothing)."""
    try:
        data = json.loads(line)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def list_sessions(folder: Path | None = None) -> list[SavedSession]:
    """Saved conversations, newest first (unreadable or empty files are skipped)."""
    folder = folder or sessions_dir()
    if not folder.is_dir():
        return []
    found = [s for p in folder.glob("*.jsonl") if (s := _summary(p)) is not None]
    return sorted(found, key=lambda s: s.modified, reverse=True)


def load_session(path: Path) -> Trace:
    """A saved conversation, read tolerantly: a line cut by a crash while it was written is left out
    (``Trace.dropped`` says how many), so the rest can still be reopened. Raises TraceError when the
    file is not a conversation at all (or not a regular file: reading a FIFO would wait for ever)."""
    try:
        regular = stat.S_ISREG(path.stat().st_mode)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    if not regular:
        raise TraceError(f"{path}: not a regular file, not a saved conversation")
    return open_trace(path, tolerant=True)


def chat_records(records: Sequence[Record]) -> list[Record]:
    """The chat turns of a recording (compare turns left out: they are not part of the conversation)."""
    out: list[Record] = []
    keep = False
    for rec in records:
        if isinstance(rec, UserTurn):
            keep = rec.mode == "chat"
        if keep:
            out.append(rec)
    return out


def conversation(records: Sequence[Record]) -> list[dict[str, str]]:
    """The messages a session needs to go on from a recording: each answered chat turn and its answer."""
    messages: list[dict[str, str]] = []
    for user, answer, _, _ in answered_turns(records):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    return messages


def answer_ids(records: Sequence[Record]) -> list[list[int] | None]:
    """The token ids of each answer of :func:`conversation`, as the model wrote them (its steps'
    committed tokens), None for a turn whose prompt left old turns out to fit the context: a
    reopened session goes on from them as the live one would have (engine/followup.py)."""
    return [None if dropped else ids for _, _, ids, dropped in answered_turns(records)]


def answered_turns(records: Sequence[Record]) -> list[tuple[str, str, list[int], bool]]:
    """(question, answer, the answer's ids, whether its prompt dropped old turns) of each chat turn
    that started answering; a turn refused or cut before its answer began (no Started, or no
    Finished after a crash) is left out."""
    turns: list[tuple[str, str, list[int], bool]] = []
    user: str | None = None
    started: Started | None = None
    ids: list[int] = []
    for rec in chat_records(records):
        if isinstance(rec, UserTurn):
            user, started, ids = rec.text, None, []
        elif isinstance(rec, Started):
            started = rec
        elif isinstance(rec, Step):
            ids.extend(c.id for c in rec.committed)
        elif isinstance(rec, Finished) and user is not None:
            if started is not None:
                turns.append((user, rec.text, ids, started.dropped_turns > 0))
            user = None
    return turns


# exports --------------------------------------------------------------------------------------------
Piece = tuple[str, str]  # (text, kind): kind in draft | target | rejected | plain | marker


@dataclass(frozen=True)
class Turn:
    """One exchange as shown: the question and the answer's pieces (kinds say where tokens came from)."""

    user: str
    label: str
    pieces: tuple[Piece, ...]


def to_markdown(turns: Sequence[Turn], title: str = "specchat conversation") -> str:
    lines = [f"# {title}", ""]
    for turn in turns:
        answer = "".join(t for t, k in turn.pieces if k not in ("rejected", "marker"))
        lines += [f"**You:** {turn.user}", "", f"**{turn.label}:**", "", answer.strip(), ""]
    return "\n".join(lines)


def to_rich_text(turns: Sequence[Turn], colours: dict[str, str], *, show_rejected: bool):
    """A Rich ``Text`` with the theme's token colours and the non-colour cues (underline, bold, strike)."""
    from rich.text import Text

    styles = {
        "draft": f"underline {colours['tok-draft']}",
        "target": f"bold {colours['tok-target']}",
        "rejected": f"strike italic {colours['tok-rejected']}",
        "marker": f"italic {colours['pending']}",
        "plain": colours["foreground"],
    }
    text = Text()
    for n, turn in enumerate(turns):
        if n:
            text.append("\n\n")
        text.append("you ", style=f"bold {colours['foreground']}")
        text.append(turn.user + "\n", style=colours["tok-user"])
        text.append(turn.label + "\n", style=colours["label"])
        for piece, kind in turn.pieces:
            if kind == "rejected" and not show_rejected:
                continue
            text.append(piece, style=styles.get(kind, colours["foreground"]))
    text.append("\n\n")
    text.append("underlined", style=styles["draft"])
    text.append(": accepted draft · ", style=colours["label"])
    text.append("bold", style=styles["target"])
    text.append(": the target's own token", style=colours["label"])
    if show_rejected:
        text.append(" · ", style=colours["label"])
        text.append("struck", style=styles["rejected"])
        text.append(": refused draft", style=colours["label"])
    return text


EXPORTS = (".md", ".html", ".svg")


def export_files(turns: Sequence[Turn], colours: dict[str, str], stem: str, *, show_rejected: bool,
                 folder: Path | None = None) -> list[Path]:
    """Write ``stem``.md, .html and .svg (``stem-2`` ... where one of those is taken: an earlier export
    is never replaced); returns their paths. Each is written whole (engine/outputs.py): a full disk or
    a folder that cannot be written raises OutputError, one line, and no half-written file is left."""
    from rich.console import Console
    from rich.terminal_theme import TerminalTheme

    from engine.outputs import OutputError, write_whole

    folder = folder or exports_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot make the exports folder {folder} ({exc.strerror or exc})") from None
    base, n = stem, 2
    while any((folder / f"{stem}{ext}").exists() for ext in EXPORTS):
        stem, n = f"{base}-{n}", n + 1
    md, html, svg = (folder / f"{stem}{ext}" for ext in EXPORTS)
    console = Console(record=True, width=100, file=open(os.devnull, "w"), force_terminal=True,  # noqa: SIM115
                      color_system="truecolor")
    console.print(to_rich_text(turns, colours, show_rejected=show_rejected))
    theme = TerminalTheme(_rgb(colours["background"]), _rgb(colours["foreground"]), [(0, 0, 0)] * 8)
    texts = (to_markdown(turns), console.export_html(theme=theme, inline_styles=True, clear=False),
             console.export_svg(theme=theme, title="specchat", clear=True))
    console.file.close()
    for path, text in zip((md, html, svg), texts, strict=True):
        write_whole(path, text, "")
    return [md, html, svg]


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    h = hex_colour.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


__all__ = ["export_files", "list_sessions", "load_session", "new_session_path"]
