"""Whether the terminal the app was started in still exists.

Why: closing a terminal window normally sends SIGHUP, which ends the app. Started through
another program (``make run``), only that program gets the hangup; the app lives on with a
dead pseudo-terminal, and its input thread spins on it at most of a core while the engine
process waits. The app polls this and quits instead (saving the conversation as on Ctrl+Q).
"""

from __future__ import annotations

import os


def terminal_gone(fd: int) -> bool:
    """True once ``fd`` (a terminal when the app started) no longer is one, or its device node
    was removed (a pseudo-terminal whose other end closed)."""
    try:
        return not os.isatty(fd) or os.fstat(fd).st_nlink == 0
    except OSError:
        return True
