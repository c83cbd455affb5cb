"""What only the UI tests do to the app: run a palette command (and ``send``, re-exported).

The builders, waits and ``send`` the tests share with the README screenshots and the device
plan's headless chat live in the app (specchat/tui/headless.py); ``palette`` acts as a user
would and nothing outside tests needs it.
"""

from __future__ import annotations

from specchat.tui.headless import send, wait_until

__all__ = ["palette", "send", "spy_notes"]


async def palette(pilot, typed: str, entry: str) -> None:
    """Open the command palette (Ctrl+P), type ``typed``, wait for an option reading ``entry`` and
    run it with Enter, as a user does."""
    await pilot.press("ctrl+p")
    await pilot.pause()
    await pilot.press(*typed)
    await wait_until(pilot, lambda: entry in str(
        [str(o.prompt) for o in pilot.app.screen.query_one("CommandList").options]), what=f"palette: {entry}")
    await pilot.press("enter")


def spy_notes(app) -> list[str]:
    """The notifications ``app`` shows from now on, as text (each still shown)."""
    notes: list[str] = []
    notify = app.notify

    def spy(message, *args, **kw):
        notes.append(str(message))
        return notify(message, *args, **kw)

    app.notify = spy
    return notes
