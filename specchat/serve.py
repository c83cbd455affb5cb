"""``specchat serve``: the chat app in a browser, through textual-serve.

textual-serve runs one shell command per browser connection and relays its terminal to xterm.js
in the page. That command is ``specchat run`` with the flags given to ``serve`` (written back with
``run``'s own parser, so a flag added to ``run`` is served too), wrapped in
:mod:`specchat.serve_session`, which takes one of ``--max-sessions`` slots before it loads a
model. Every tab is a whole app with its own engine process, so the number of tabs is bounded by
what the machine holds; one tab too many gets a page that says so instead of an engine that
would push the others into swap.

Everything the user can get wrong (flags, model, host, port) is refused here, in one line,
before the server starts: a served session can only show its error in a browser, once per tab.
The server itself (textual-serve's, made quiet and strict) is :mod:`specchat.serve_server`.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import ipaddress
import os
import shlex
import signal
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import UserError
from specchat.command_options import RunOptions, ServeOptions, flatten
from specchat.serve_guard import WILDCARD_HOSTS, Guard
from specchat.serve_server import SpecchatServer

# what one session costs beside its weights, measured on the embedded model (SmolLM2-135M, a
# 98 MB GGUF): the app process held 250 MB resident, its engine process 540 MB
APP_BYTES = 300 * 2**20
ENGINE_BYTES = 500 * 2**20
WEIGHT_FACTOR = 1.5  # resident weights and what the forward allocates around them, per byte on disk
MEMORY_SHARE = 0.8  # of the memory available when the server starts: leave the rest to the system
WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.pth")


class ServeError(UserError):
    """A bad ``serve`` flag or an address that cannot be served: one line, exit status 2."""


@dataclass(frozen=True)
class SessionBudget:
    """How many browser sessions (each an app and an engine) this machine holds for the model.

    ``available`` is the memory free now (host memory, or the GPU's for a CUDA device) and
    ``cores`` the CPU cores when the engines run on the CPU (None on a GPU): two engines already
    share the cores, more only slow every tab down. None means unknown: that bound is left out.
    """

    per_session: int
    available: int | None
    cores: int | None

    @property
    def by_memory(self) -> int | None:
        if self.available is None:
            return None
        return int(self.available * MEMORY_SHARE // self.per_session)

    @property
    def fits(self) -> int:
        """The default ``--max-sessions``: the lower bound of memory and cores, at least one."""
        bounds = [b for b in (self.by_memory, self.cores) if b is not None]
        return max(1, min(bounds)) if bounds else 1

    def describe(self) -> str:
        """Why that number, in words (printed by the server and shown on the refusal page)."""
        parts = [f"each session needs about {_size(self.per_session)}"]
        if self.available is not None:
            parts.append(f"{_size(self.available)} of memory is free")
        if self.cores is not None:
            parts.append(f"{self.cores} CPU core{'s' if self.cores != 1 else ''}")
        return ", ".join(parts)


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def run_argv(options: RunOptions, parser: argparse.ArgumentParser) -> list[str]:
    """The ``specchat run`` arguments equal to ``options``: each flag of ``run`` that differs from its default.

    Why from ``run``'s parser (``ServeOptions.run_parser``, set by the CLI) and not a list here: the
    served app must take exactly the flags ``run`` takes, today's and tomorrow's. The model goes last,
    after ``--``.
    """
    values = flatten(options)  # every dest of `run` (test_serve checks that none is missing)
    flags: list[str] = []
    positional: list[str] = []
    for action in parser._actions:
        if action.default == argparse.SUPPRESS:  # --help: no value to forward
            continue
        value = values[action.dest]
        if value is None or value == action.default:
            continue
        if not action.option_strings:
            positional.append(str(value))
        elif isinstance(action, argparse.BooleanOptionalAction):
            flags.append(action.option_strings[0] if value else action.option_strings[1])
        elif action.nargs == 0:  # store_true
            flags.append(action.option_strings[0])
        else:
            flags += [action.option_strings[0], str(value)]
    return [*flags, "--", *positional] if positional else flags


def session_command(run_args: list[str], slots: Path, limit: int, note: str) -> str:
    """The shell command textual-serve starts for each browser connection: exec'd, so that the process the server
    holds is the tab's itself (its group's leader once it has its own session), not a shell above it."""
    return "exec " + shlex.join([sys.executable, "-m", "specchat.serve_session", "--slots", str(slots),
                       "--limit", str(limit), "--note", note, "--", *run_args])


def check_address(host: str, port: int) -> None:
    """Refuse, in one line, an address the server could not listen on (it would fail after its banner)."""
    if not 1 <= port <= 65535:
        raise ServeError(f"--port {port}: choose a port from 1 to 65535 (default 8000)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ServeError(f"--host {host}: no such address ({exc.strerror}); use 127.0.0.1 (this machine only), "
                         "0.0.0.0 (every interface) or an address of this machine") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            sock.bind(address)
        except OSError as exc:
            raise ServeError(_bind_error(host, port, exc)) from None


def _bind_error(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use (another server?); pick a free one with --port"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine; use 127.0.0.1 or 0.0.0.0"
    if exc.errno == errno.EACCES:
        return f"port {port} needs privileges here; use a port above 1023, e.g. --port 8000"
    return f"cannot listen on {host}:{port} ({exc.strerror or exc})"


def is_local(host: str) -> bool:
    """True when only this machine can connect: a loopback address or a name that resolves only to one."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if host in WILDCARD_HOSTS:
        return False
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def public_url(host: str, port: int, given: str | None) -> str:
    """The address to open: ``--public-url``, else http://HOST:PORT (this machine's name for a wildcard)."""
    if given:
        return given.rstrip("/")
    name = socket.getfqdn() if host in WILDCARD_HOSTS else host
    if ":" in name:  # an IPv6 literal
        name = f"[{name}]"
    return f"http://{name}:{port}"


def available_memory() -> int | None:
    """Memory available to new processes now (Linux's MemAvailable), or None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def weight_bytes(options: RunOptions) -> int:
    """Bytes of the model's weights as a session will hold them (0 for the scripted ``--fake`` model).

    Resolving here also refuses a missing model in one line, and does a first run's conversion
    or download once, before the tabs start, rather than in every tab at the same time.
    """
    if options.fake:
        return 0
    from engine.models.resolve import resolve_model

    target = options.target
    resolved = resolve_model(target.model, revision=target.revision, allow_pickle=target.allow_pickle,
                             weights="fp32" if target.weights == "fp32" else "stored",
                             backend=target.backend or "auto", progress=_progress_printer())
    if resolved.gguf is not None:
        return Path(resolved.gguf).stat().st_size
    folder = Path(resolved.path)
    return sum(f.stat().st_size for pattern in WEIGHT_GLOBS for f in folder.glob(pattern))


def _progress_printer():
    """A resolve progress callback printing each new stage once (a download reports many times)."""
    seen: set[str] = set()

    def show(description: str, done: int, total: int) -> None:
        if description not in seen:
            seen.add(description)
            print(f"specchat serve: {description}", file=sys.stderr)

    return show


def session_budget(options: RunOptions) -> SessionBudget:
    """The budget for the model of ``options`` on the device its engines will use (a GPU's memory bounds GPU
    engines)."""
    weights = int(WEIGHT_FACTOR * weight_bytes(options))
    host = SessionBudget(APP_BYTES + ENGINE_BYTES + weights, available_memory(), os.cpu_count())
    if options.fake:
        return host
    from engine.loader import pick_device

    device = pick_device(options.target.device or "auto")
    if device.type != "cuda":
        return host
    import torch

    gpu = SessionBudget(ENGINE_BYTES + weights, torch.cuda.mem_get_info(device)[0], None)
    host = dataclasses.replace(host, cores=None)  # the engines compute on the GPU: the cores bound nothing
    return gpu if gpu.fits <= host.fits else host


def tab_options(options: ServeOptions, precision: str) -> RunOptions:
    """What each tab's ``specchat run`` gets: serve's run flags, the precision resolved once, and with
    ``--record FILE`` leave to replace its slot's trace: FILE was checked once, at start (an earlier
    trace there needs serve's own --force), and a reloaded tab records its slot again."""
    run = options.run_options()
    if run.record:
        run = dataclasses.replace(run, force=True)
    if not run.fake:  # resolved once; every tab runs the same
        run = dataclasses.replace(run, target=dataclasses.replace(run.target, precision=precision))
    return run


def run_serve(options: ServeOptions) -> int:
    from specchat.tui.launch import preflight

    check_address(options.host, options.port)
    _, precision = preflight(options)  # the flags `run` would refuse, refused once here
    run = tab_options(options, precision)
    budget = session_budget(run)
    limit = options.max_sessions or budget.fits
    if options.max_sessions and options.max_sessions > budget.fits:
        print(f"specchat serve: warning: --max-sessions {limit} is more than this machine holds ({budget.fits}: "
              f"{budget.describe()}); the last tabs may run out of memory", file=sys.stderr)
    if not is_local(options.host):
        print(f"specchat serve: warning: listening on {options.host}: anyone who can reach port {options.port} and "
              "has the address printed below (its token) can use the model and this machine's CPU, over plain "
              "HTTP (keep 127.0.0.1 and use an SSH tunnel, or put a proxy with TLS in front)", file=sys.stderr)
    url = public_url(options.host, options.port, options.public_url)
    guard = Guard.for_address(options.host, options.public_url)
    note = budget.describe()
    with tempfile.TemporaryDirectory(prefix="specchat-serve-") as slots:
        command = session_command(run_argv(run, options.run_parser), Path(slots), limit, note)
        server = SpecchatServer(command, host=options.host, port=options.port, title="specchat", public_url=url)
        server.guard = guard
        server.banner = (f"specchat serve: open {guard.url(url)} in a browser (one engine per tab, at most "
                         f"{limit} at once: {note}); Ctrl+C stops")
        server.serve()
    if server.stopped_by is None:  # the server ended by itself (a replaced serve in the tests)
        return 0
    print("specchat serve: stopped", file=sys.stderr)
    return 130 if server.stopped_by == signal.SIGINT else 0  # Ctrl+C: 130, as every command (specchat.cli)
