"""What only the UI tests do to the app: type a prompt, run a palette command.

The builders and waits the tests share with the README screenshots live in the app
(specchat/tui/headless.py); these two act as a user would and nothing outside tests needs them.
"""

from __future__ import annotations

from specchat.tui.headless import wait_until


async def send(pilot, text: str, prompt_id: str = "#prompt") -> None:
    prompt = pilot.app.screen.query_one(prompt_id)
    prompt.load_text(text)
    prompt.focus()
    await pilot.press("enter")


async def palette(pilot, typed: str, entry: str) -> None:
    """Open the command palette (Ctrl+P), type ``typed``, wait for an option reading ``entry`` and
    run it with Enter, as a user does."""
    await pilot.press("ctrl+p")
    await pilot.pause()
    await pilot.press(*typed)
    await wait_until(pilot, lambda: entry in str(
        [str(o.prompt) for o in pilot.app.screen.query_one("CommandList").options]), what=f"palette: {entry}")
    await pilot.press("enter")
