"""``specchat serve`` in a real headless browser: the page loads, a prompt is typed, coloured tokens appear,
and a tab beyond ``--max-sessions`` gets the refusal instead of an engine.

The page draws the terminal with xterm.js on a canvas, so there is no text in the DOM to read;
the test wraps the page's WebSocket before the page's own script runs and reads the terminal
stream the app sends (the ANSI output of the real Textual app, truecolor). An accepted draft
token is text written in the theme's accepted colour (``38;2;R;G;B``).

Needs Chromium, its driver and selenium: ``bash scripts/setup_browser.sh`` installs them (Debian's
packages; nothing is downloaded by the test). Skipped, saying so, where they are missing. Slow
(a browser and an app process start, on a CPU shared with the suite), so marked ``slow``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from specchat.themes import DARK_PALETTE
from specchat.tui.scripted import DEMO_ANSWERS

pytestmark = pytest.mark.slow

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
CHROMEDRIVER = shutil.which("chromedriver")
try:
    import selenium  # noqa: F401
except ImportError:
    HAVE_SELENIUM = False
else:
    HAVE_SELENIUM = True
MISSING = ", ".join(name for name, ok in (("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER),
                                          ("selenium", HAVE_SELENIUM)) if not ok)
if MISSING:
    pytestmark = [pytestmark, pytest.mark.skip(reason=f"no headless browser ({MISSING} missing): "
                                                      "run bash scripts/setup_browser.sh")]

START_S = 120  # generous: the app and its engine process start on a CPU the rest of the suite shares
# records every frame the server sends, before textual-serve's script opens its socket
RECORD_STREAM = r"""
window.__specchatStream = [];
const NativeWebSocket = window.WebSocket;
const decoder = new TextDecoder();
window.WebSocket = function (url, protocols) {
  const ws = protocols === undefined ? new NativeWebSocket(url) : new NativeWebSocket(url, protocols);
  ws.addEventListener('message', (event) => {
    const data = event.data;
    if (typeof data === 'string') window.__specchatStream.push(data);
    else if (data instanceof ArrayBuffer) window.__specchatStream.push(decoder.decode(data, {stream: true}));
    else if (data instanceof Blob) data.text().then((text) => window.__specchatStream.push(text));
  });
  return ws;
};
window.WebSocket.prototype = NativeWebSocket.prototype;
Object.assign(window.WebSocket, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
"""


def _rgb(hex_colour: str) -> str:
    return ";".join(str(int(hex_colour[i:i + 2], 16)) for i in (1, 3, 5))


ACCEPTED = _rgb(DARK_PALETTE.accepted)
TARGET = _rgb(DARK_PALETTE.target)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(cond: Callable[[], bool], what: str, timeout: float, detail: Callable[[], str] = str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s\n{detail()}")
        time.sleep(0.25)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """``specchat serve --fake`` (the scripted model) on a free port, one session at most; stopped after.
    Yields the address it prints, with its token: the page is refused without it."""
    port = _free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-m", "specchat", "serve", "--fake", "--theme", "dark",
                                   "--port", str(port), "--max-sessions", "1"],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def printed_url() -> str | None:
        """The address the server prints (with its launch's token), once it listens."""
        assert server.poll() is None, f"the server exited: {log.read_text()}"
        found = re.search(rf"open (http://127\.0\.0\.1:{port}/\?token=[\w-]+) ", log.read_text())
        return found[1] if found else None

    try:
        _wait(lambda: printed_url() is not None, "the server listens and prints its address", START_S,
              log.read_text)
        yield printed_url()
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and the app processes it started
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1280,800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _open(driver, url: str) -> Callable[[], str]:
    """Open ``url`` in the current tab, recording its terminal stream; returns a reader of the stream so far."""
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_STREAM})
    driver.get(url)
    return lambda: driver.execute_script("return (window.__specchatStream || []).join('')")


def _coloured(stream: str, rgb: str) -> list[str]:
    """The runs of text the terminal writes in foreground colour ``rgb``."""
    return [text for text in re.findall(rf"\x1b\[(?:[0-9;]*;)?38;2;{rgb}(?:;[0-9;]*)?m([^\x1b]+)", stream)
            if text.strip()]


def test_a_prompt_typed_in_the_browser_streams_coloured_tokens_and_a_second_tab_is_refused(served, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    stream = _open(browser, served)
    _wait(lambda: "Ask something" in stream(), "the chat screen is drawn in the page", START_S,
          lambda: stream()[-2000:])
    before = len(stream())
    terminal_input = browser.find_element(By.CSS_SELECTOR, ".xterm-helper-textarea")
    terminal_input.send_keys("Say hello")
    terminal_input.send_keys(Keys.ENTER)

    answer = DEMO_ANSWERS[0]

    def accepted_tokens() -> list[str]:
        return [t for t in _coloured(stream()[before:], ACCEPTED) if len(t.strip()) > 2 and t.strip() in answer]

    _wait(lambda: len(accepted_tokens()) >= 5, "accepted draft tokens of the answer appear in the accepted colour",
          60, lambda: repr(stream()[before:][-2000:]))
    assert "you" in stream()[before:] and "Say hello" in stream()[before:]  # the prompt as typed, echoed
    from_target = [t for t in _coloured(stream()[before:], TARGET) if t.strip() in answer]
    assert from_target, "the target's own tokens are drawn in their colour too"

    browser.switch_to.new_window("tab")
    second = _open(browser, served)
    _wait(lambda: "no engine free" in second(), "the second tab is refused", START_S, lambda: second()[-2000:])
    assert "--max-sessions" in second() and "Ask something" not in second()
