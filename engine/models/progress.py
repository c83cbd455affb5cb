"""Progress reporting for slow model preparation (first-run conversion, hub downloads).

The engine reports progress through a plain callable so that it stays UI-agnostic: the CLI wraps
it in a rich progress bar (:func:`rich_progress`), the TUI loading screen in its own widget. rich is
imported lazily so that importing this module (for the type alone) costs nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# (description, done, total). Calls with a new description start a new task; total may be 0
# when unknown. Callbacks are invoked on the thread doing the work and must be cheap.
ProgressCallback = Callable[[str, int, int], None]


def report(progress: ProgressCallback | None, description: str, done: int, total: int) -> None:
    """Call ``progress`` if there is one (saves an ``if`` at every call site)."""
    if progress is not None:
        progress(description, done, total)


@contextmanager
def rich_progress(*, transient: bool = True, file: Any = None) -> Iterator[ProgressCallback]:
    """Yield a :data:`ProgressCallback` that draws one rich progress bar per description on stderr.

    ``transient`` clears the bars when the block ends, so a finished first-run conversion does not
    leave clutter above the chat. ``file`` overrides the output stream (tests).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=file if file is not None else sys.stderr)
    bars = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
    )
    tasks: dict[str, Any] = {}

    def callback(description: str, done: int, total: int) -> None:
        task = tasks.get(description)
        if task is None:
            task = tasks[description] = bars.add_task(description, total=total or None)
        bars.update(task, completed=done, total=total or None)

    with bars:
        yield callback
