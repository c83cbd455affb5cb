"""The web server of ``specchat serve``: textual-serve's, with a quiet console, the page's frames only, a clean stop.

:mod:`specchat.serve` checks the flags and the machine and builds the command each tab runs; this
is what answers the browsers: textual-serve's aiohttp app behind :mod:`specchat.serve_guard`, with
what textual-serve left loud or loose made quiet or strict (one console line per thing gone wrong,
never a traceback or what a client sent; a frame that is not the page's dropped; Ctrl+C closes the
tabs and returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from typing import Any, TextIO

from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_runner import GracefulExit
from textual_serve.app_service import AppService
from textual_serve.server import Server

from specchat.serve_guard import Guard

STOP_S = 10.0  # after Ctrl+C, how long the tabs get to close (each app quits) before they are cut off
MAX_CELLS = 1000  # a terminal side in cells that a page may ask for: more is no screen, only memory
LINE_CHARS = 200  # the longest console line the server writes about a request


class ConsoleLine(logging.Handler):
    """The server's console log: one short line per warning or error, never a traceback.

    Why not textual-serve's (rich tracebacks with their local variables): a request aiohttp cannot
    read (a 64 KB URL, a bad Content-Length) was logged as fifty lines quoting the raw request,
    the token in its URL included, on a console others may watch. A line names what happened and
    the exception's type, never its text (which quotes what the client sent).
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(logging.WARNING)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(console_line(record) + "\n")
            self.stream.flush()
        except Exception:  # a closed console: the logging module's own report
            self.handleError(record)


def console_line(record: logging.LogRecord) -> str:
    """``record`` as one console line of at most LINE_CHARS characters, with nothing the client wrote."""
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, HttpProcessingError):  # aiohttp's parser: its message quotes the request
        text = f"refused a request it could not read ({type(error).__name__}, answered {error.code})"
    else:
        # a format string written in code (its arguments: an address), not an object logged as the
        # message (textual-serve logs the exception itself, whose text may quote a frame)
        text = record.getMessage() if isinstance(record.msg, str) else f"{record.name} failed"
        if error is not None:
            text = f"{text} ({type(error).__name__})"
    text = " ".join(text.split())  # one line, whatever the message held
    return f"specchat serve: {text}"[:LINE_CHARS]


def page_frame(message: Any) -> tuple[str, Any] | None:
    """A WebSocket frame as the page's own script sends it (``["stdin", text]``, ``["resize", {"width": W,
    "height": H}]``, ``["ping", text]``, ``["focus"]``, ``["blur"]``), as (kind, data); None for anything else.

    Why: textual-serve read every text frame with ``message.json()`` and indexed into it, so one
    frame that was not the page's (garbage, a number, a size in words) ended the tab's socket with
    a traceback on the console.
    """
    if message.type != WSMsgType.TEXT:
        return None
    try:
        envelope = json.loads(message.data)
    except ValueError:
        return None
    if not isinstance(envelope, list) or not envelope or not isinstance(envelope[0], str):
        return None
    kind, data = envelope[0], envelope[1] if len(envelope) > 1 else None
    if kind in ("stdin", "ping"):
        return (kind, data) if isinstance(data, str) else None
    if kind in ("focus", "blur"):
        return kind, None
    if kind == "resize" and isinstance(data, dict):
        size = data.get("width"), data.get("height")
        if all(type(n) is int and 1 <= n <= MAX_CELLS for n in size):
            return kind, size
    return None


def _kill_tab(pid: int) -> None:
    """Kill a tab that did not quit: its whole process group (the app and its engine; the tab is its group's
    leader, :func:`specchat.serve.session_command` execs it), else the one process (a shell that did not exec)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class SpecchatServer(Server):
    """textual-serve's server, announcing the address in one line instead of its logo and the session command
    (a long line of internal flags that tells the user nothing), and answering only its user
    (:mod:`specchat.serve_guard`: the Host, the Origin and the launch's token of every request).

    Its console holds that line and one line per thing gone wrong (:class:`ConsoleLine`); a frame
    that is not the page's is dropped (:func:`page_frame`); Ctrl+C closes the tabs and returns,
    ``stopped_by`` saying which signal stopped it.
    """

    banner: str = ""
    guard: Guard | None = None
    stopped_by: int | None = None

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        if self.guard is None:  # set by run_serve; a server without one would answer any web page
            self.guard = Guard.for_address(self.host, self.public_url)
        app.middlewares.append(self.guard.middleware())
        self.tabs: dict[web.WebSocketResponse, AppService] = {}  # the open tabs, for on_shutdown
        return app

    async def on_shutdown(self, app: web.Application) -> None:
        """Close every tab as the server stops: its socket closed, its loop ends and textual-serve tells its app to
        quit (at once, rather than after aiohttp's shutdown timeout cancels it); an app still running STOP_S later
        is killed, with its engine: in a session of its own (:func:`specchat.serve_session.own_session`), it
        would outlive the server and hold its memory."""
        tabs = list(self.tabs.items())
        await asyncio.gather(*(ws.close(code=WSCloseCode.GOING_AWAY, message=b"specchat serve stopped")
                               for ws, _ in tabs))
        processes = [p for _, service in tabs if (p := getattr(service, "_process", None)) is not None]
        if not processes:
            return
        _, running = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in processes], timeout=STOP_S)
        for process in processes:
            if process.returncode is None:
                _kill_tab(process.pid)
        await asyncio.gather(*running)

    def initialize_logging(self) -> None:
        """One line per warning or error on stderr (not textual-serve's tracebacks), no line per page load."""
        logging.getLogger().addHandler(ConsoleLine(sys.stderr))
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    def serve(self, debug: bool = False) -> None:
        """textual-serve's serve, stopping cleanly: the first SIGINT or SIGTERM closes every tab (each app is told
        to quit; STOP_S later the rest are cut off) and returns; a second one while that runs changes nothing.

        Why not textual-serve's own: its handler raised again on a second Ctrl+C, in the middle of the
        shutdown, and the run_app it called printed nothing of why it ended.
        """
        self.debug = debug
        self.initialize_logging()
        loop = asyncio.new_event_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            # no signal handlers in this loop (Windows): Ctrl+C reaches the CLI as KeyboardInterrupt
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signum, self._stop, signum)
        web.run_app(self._make_app(), host=self.host, port=self.port, handle_signals=False, loop=loop,
                    print=None, shutdown_timeout=STOP_S)
        if self.stopped_by is not None:  # stopped: one more Ctrl+C now would kill the process in its last steps
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)

    def _stop(self, signum: int) -> None:
        if self.stopped_by is not None:  # already stopping: the tabs are closing
            return
        self.stopped_by = signum
        raise GracefulExit()

    async def _process_messages(self, websocket: web.WebSocketResponse, app_service: AppService) -> None:
        """textual-serve's loop over the page's frames, taking only the frames its page sends (:func:`page_frame`):
        any other is dropped, the first with one console line. The tab is in ``tabs`` meanwhile, for
        :meth:`on_shutdown`."""
        self.tabs[websocket] = app_service
        try:
            await self._take_frames(websocket, app_service)
        finally:
            self.tabs.pop(websocket, None)

    async def handle_websocket(self, request: web.Request) -> web.StreamResponse:
        """textual-serve's tab, refused with a plain 400 when the page's size is no screen's: it started the app
        with whatever number ``?width=`` and ``?height=`` held (a million columns: the app's memory)."""
        for name in ("width", "height"):
            value = request.query.get(name, "1")
            if not (value.isdigit() and 1 <= int(value) <= MAX_CELLS):
                return web.Response(status=400, text=f"specchat serve: refused: {name} must be a number of "
                                                     f"cells from 1 to {MAX_CELLS}\n")
        return await super().handle_websocket(request)

    async def _take_frames(self, websocket: web.WebSocketResponse, app_service: AppService) -> None:
        with contextlib.suppress(ConnectionError):  # the tab went while its pong was sent: nothing to say
            await self._dispatch(websocket, app_service)

    async def _dispatch(self, websocket: web.WebSocketResponse, app_service: AppService) -> None:
        dropped = False
        async for message in websocket:
            if message.type == WSMsgType.ERROR:  # the connection broke (a closed tab, a reset): no frame, no line
                break
            frame = page_frame(message)
            if frame is None:
                if not dropped:
                    logging.getLogger("textual-serve").warning("dropped a WebSocket frame that is not the page's "
                                                               "(and any more on this tab)")
                dropped = True
                continue
            kind, data = frame
            if kind == "stdin":
                await app_service.send_bytes(data.encode("utf-8"))
            elif kind == "resize":
                await app_service.set_terminal_size(*data)
            elif kind == "ping":
                await websocket.send_json(["pong", data])
            elif kind == "blur":
                await app_service.blur()
            else:
                await app_service.focus()

    async def on_startup(self, app: web.Application) -> None:
        self.console.print(self.banner, highlight=False, soft_wrap=True)
