"""One browser session of ``specchat serve``: take a free engine slot and become ``specchat run``, or say why not.

textual-serve starts ``python -m specchat.serve_session --slots DIR --limit N --note TEXT -- RUN-ARGS``
for each browser connection (:func:`specchat.serve.session_command` builds it). A slot is a lock
file in DIR that the session holds locked (``flock``) for its whole life: the kernel frees it
when the process ends, however it ends (a closed tab, a crash, a kill), so no count can leak.
With every slot taken, the tab gets a small app that says so instead of an engine the machine
cannot hold.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Static

GRACE_S = 5.0  # a reloaded tab's old session is still closing for a moment: wait for its slot that long
POLL_S = 0.2


@dataclass
class Slot:
    """A held slot: ``index`` (0-based) and the open, locked file descriptor (closing it frees the slot)."""

    index: int
    fd: int

    def release(self) -> None:
        os.close(self.fd)


def acquire_slot(folder: Path, limit: int) -> Slot | None:
    """The first free slot of ``limit`` in ``folder``, locked for this process; None when all are held."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no limit rather than no sessions
        return Slot(0, os.open(os.devnull, os.O_RDONLY))
    for index in range(limit):
        fd = os.open(folder / f"slot-{index}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return Slot(index, fd)
    return None


def wait_for_slot(folder: Path, limit: int, grace_s: float = GRACE_S) -> Slot | None:
    """:func:`acquire_slot`, retried for ``grace_s`` seconds (a reload frees its slot just after it asks)."""
    deadline = time.monotonic() + grace_s
    while True:
        slot = acquire_slot(folder, limit)
        if slot is not None or time.monotonic() >= deadline:
            return slot
        time.sleep(POLL_S)


def refusal_text(limit: int, note: str) -> str:
    """What the tab beyond the limit shows."""
    tabs = "one browser tab has" if limit == 1 else f"{limit} browser tabs have"
    return (f"specchat serve: no engine free for this tab.\n\n"
            f"{tabs} an engine already, the most this server runs ({note}).\n\n"
            "Close one of those tabs (its engine stops with it) and reload this page, "
            "or restart the server with a larger --max-sessions.\n\nPress q to close.")


def record_for_slot(run_args: list[str], index: int) -> list[str]:
    """``--record FILE`` made FILE.sessionN.jsonl for slot N > 0, so that two tabs never write one trace."""
    if index == 0 or "--record" not in run_args:
        return run_args
    at = run_args.index("--record") + 1
    path = Path(run_args[at])
    return [*run_args[:at], str(path.with_name(f"{path.stem}.session{index}{path.suffix}")), *run_args[at + 1:]]


class RefusalApp(App[int]):
    """The whole app of a refused tab: the reason, and a key to close it."""

    BINDINGS: ClassVar[list[Binding]] = [Binding("q", "quit", "close")]
    CSS = "Screen { align: center middle; } #refusal { width: 72; padding: 1 2; border: round $error; }"

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        yield Static(self.text, id="refusal", markup=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specchat.serve_session")
    parser.add_argument("--slots", type=Path, required=True)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--note", default="")
    parser.add_argument("run_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    run_args = args.run_args[1:] if args.run_args[:1] == ["--"] else args.run_args
    slot = wait_for_slot(args.slots, args.limit, GRACE_S)
    if slot is None:
        RefusalApp(refusal_text(args.limit, args.note)).run()
        return 0
    # become `specchat run`, the locked descriptor kept open across exec: the slot is held as long
    # as the app lives, and no process stays behind to hold it
    os.set_inheritable(slot.fd, True)
    os.execv(sys.executable, [sys.executable, "-m", "specchat", "run", *record_for_slot(run_args, slot.index)])
    return 0  # not reached (execv replaced this process); a replaced execv in the tests returns


def own_session() -> None:
    """Put this tab (and the ``specchat run`` it becomes, and its engine process) in a session of its own, bound
    to the server's life.

    Why its own session: the terminal sends Ctrl+C to every process of its foreground group, and
    textual-serve starts the tabs in the server's. Each tab's app and engine were then interrupted
    mid-step and printed their tracebacks (KeyboardInterrupt, "Exception ignored in ...") on the
    server's console, which relays a tab's stderr; in a session of their own only the server gets
    Ctrl+C, and it tells each tab to quit. Why bound (Linux: a SIGTERM when the server dies, kept
    across the exec): out of the server's group, a tab would outlive a server killed outright,
    holding its model; its engine stops when the app's end of their pipe closes.
    """
    server = os.getppid()
    with contextlib.suppress(AttributeError, PermissionError):  # no setsid (Windows); a group leader already
        os.setsid()
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != server:  # the server died before the binding: nothing will send it
        sys.exit(0)


if __name__ == "__main__":  # as the server starts a tab (the tests call main, in their own session)
    own_session()
    sys.exit(main())
