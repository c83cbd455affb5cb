"""``specchat serve``: its flags, the command each browser tab runs, the one-line refusals, the session limit.

The server itself is not started here (tests/test_serve_browser.py drives a real one with a
headless browser): ``SpecchatServer.serve`` is replaced, so these check everything up to it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from aiohttp import WSMsgType

from engine.knobs import KNOBS
from specchat import serve, serve_server, serve_session
from specchat.cli import add_run_args, build_parser, main
from specchat.serve import ServeError, SessionBudget, check_address, run_argv, session_command
from specchat.serve_guard import Guard
from specchat.serve_session import RefusalApp, acquire_slot, record_for_slot, refusal_text, wait_for_slot
from tests.parsed import parsed


def _run_dests() -> list[str]:
    parser = argparse.ArgumentParser(add_help=False)
    add_run_args(parser)
    return [a.dest for a in parser._actions]


def _as_run(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def _forwarded(argv: list[str]) -> list[str]:
    """The run arguments ``serve ARGV`` hands each tab."""
    served = parsed("serve", *argv)
    return run_argv(served.run_options(), served.run_parser)


def _round_trip(argv: list[str]) -> None:
    """``serve ARGV`` hands each tab the run arguments that ``run ARGV`` would have parsed."""
    forwarded = _forwarded(argv)  # `run` itself parses it: a serve-only flag left in would be refused
    again, direct = vars(_as_run(forwarded)), vars(_as_run(argv))
    assert {k: again[k] for k in _run_dests()} == {k: direct[k] for k in _run_dests()}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# the command line -------------------------------------------------------------------------------
def test_serve_parses_its_flags_and_every_run_flag():
    args = build_parser().parse_args(["serve", "some/model", "--host", "0.0.0.0", "--port", "9001",
                                      "--max-sessions", "3", "--speculative-num-steps", "4",
                                      "--no-adaptive-draft", "--temperature", "0.7", "--theme", "light"])
    assert (args.command, args.model, args.host, args.port, args.max_sessions) == ("serve", "some/model",
                                                                                    "0.0.0.0", 9001, 3)
    assert (args.num_steps, args.adaptive_draft, args.temperature, args.theme) == (4, False, 0.7, "light")
    defaults = build_parser().parse_args(["serve"])
    assert (defaults.host, defaults.port, defaults.max_sessions) == ("127.0.0.1", 8000, None)
    assert set(_run_dests()) <= set(vars(defaults))


@pytest.mark.parametrize("argv", [
    [],
    ["--fake"],
    ["./my model", "--method", "eagle3", "--draft", "heads/x", "--speculative-eagle-topk", "1"],
    ["--adaptive-draft", "--temperature", "0.5", "--top-p", "0.9", "--seed", "7", "--sampling", "rejection"],
    ["--no-adaptive-draft", "--compare", "--teach", "--record", "out/trace.jsonl", "--backend", "hf"],
    ["--speculative-ngram-match-type", "prob", "--allow-pickle", "--threads", "1", "--", "-odd-name"],
])
def test_the_tab_command_carries_the_run_options(argv):
    _round_trip(argv)


def test_a_tab_may_replace_its_own_trace():
    """serve checks ``--record FILE`` once (an earlier trace needs --force); a tab reloaded in its slot then
    records that slot again rather than being refused by its own earlier trace."""
    from specchat.serve import tab_options

    assert tab_options(parsed("serve", "--fake", "--record", "t.jsonl"), "exact").force
    assert "--force" in run_argv(tab_options(parsed("serve", "--fake", "--record", "t.jsonl"), "exact"),
                                 parsed("serve").run_parser)
    assert not tab_options(parsed("serve", "--fake"), "exact").force


def _other_value(action: argparse.Action) -> str:
    """A value ``action`` takes that is not its default: a choice, else the first its type accepts."""
    choices = action.choices or (KNOBS[action.dest].choices if action.dest in KNOBS else ())
    if choices:
        return next(c for c in choices if c != action.default)
    for text in ("3", "0.5", "5000", "x", "light"):  # light: a --theme
        try:
            if action.type is not None:
                action.type(text)
            return text
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
    raise AssertionError(f"no value for {action.option_strings[0]}")


def test_every_run_flag_is_forwarded():
    """Each flag of ``run``, set to a value other than its default, reaches the tab: a flag added to
    ``run`` later is served without a change here."""
    parser = argparse.ArgumentParser(add_help=False)
    add_run_args(parser)
    argv: list[str] = []
    for action in parser._actions:
        if not action.option_strings:
            continue  # the model, given last
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(action.option_strings[1])
        elif action.nargs == 0:
            argv.append(action.option_strings[0])
        else:
            argv += [action.option_strings[0], _other_value(action)]
    argv += ["--", "a-model"]
    forwarded = _forwarded(argv)
    changed = {a.dest for a in parser._actions}
    again, direct = vars(_as_run(forwarded)), vars(_as_run(argv))
    assert all(again[d] == direct[d] != parser.get_default(d) for d in changed), forwarded


def test_session_command_runs_the_session_wrapper_with_the_run_args(tmp_path):
    run_args = ["--fake", "--record", "a trace.jsonl", "--", "my model"]
    words = shlex.split(session_command(run_args, tmp_path, 2, "at most 2; 1 GB free"))
    assert words[:4] == ["exec", sys.executable, "-m", "specchat.serve_session"]  # no shell left above the tab
    words = words[1:]
    cut = words.index("--")
    assert words[cut + 1:] == run_args
    wrapper = argparse.Namespace(**dict(zip(words[3:cut:2], words[4:cut:2], strict=True)))
    assert vars(wrapper) == {"--slots": str(tmp_path), "--limit": "2", "--note": "at most 2; 1 GB free"}


# one-line refusals, before anything starts ------------------------------------------------------
def test_a_port_in_use_is_refused_in_one_line():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ServeError, match=rf"port {port} .* in use.*--port"):
            check_address("127.0.0.1", port)
    check_address("127.0.0.1", port)  # free again: accepted


@pytest.mark.parametrize(("host", "port", "says"), [
    ("127.0.0.1", 0, "from 1 to 65535"),
    ("127.0.0.1", 70000, "from 1 to 65535"),
    ("no-such-host.invalid", 8000, "no such address"),
    ("192.0.2.1", 8000, "not an address of this machine"),  # TEST-NET-1: never this machine's
])
def test_bad_addresses_are_refused(host, port, says):
    with pytest.raises(ServeError, match=says):
        check_address(host, port)


@pytest.fixture
def no_server(monkeypatch):
    """Replace the server's loop: the tests see the server that would have run."""
    started: list[serve.SpecchatServer] = []
    monkeypatch.setattr(serve.SpecchatServer, "serve", lambda self, debug=False: started.append(self))
    return started


@pytest.mark.parametrize(("argv", "says"), [
    (["./no/such/model"], "no such file or folder"),
    (["--fake", "--method", "bogus"], "unknown method 'bogus'"),
    (["--fake", "--max-sessions", "0"], "--max-sessions: must be an integer from 1 to"),
    (["--fake", "--port", "0"], "from 1 to 65535"),
])
def test_main_refuses_bad_input_in_one_line_before_serving(argv, says, no_server, capsys):
    port = [] if "--port" in argv else ["--port", str(_free_port())]  # 8000 may be taken on this machine
    assert main(["serve", *argv, *port]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err
    assert not no_server


def test_main_serves_the_run_flags_and_prints_the_url(no_server, capsys):
    port = _free_port()
    assert main(["serve", "--fake", "--port", str(port), "--max-sessions", "1", "--speculative-num-steps", "4"]) == 0
    [server] = no_server
    assert (server.host, server.port, server.public_url) == ("127.0.0.1", port, f"http://127.0.0.1:{port}")
    words = shlex.split(server.command)
    assert sorted(words[words.index("--") + 1:]) == ["--fake", "--speculative-num-steps", "4"]
    assert words[words.index("--limit") + 1] == "1"
    assert f"open http://127.0.0.1:{port}/?token={server.guard.token}" in server.banner
    assert "warning" not in capsys.readouterr().err


def test_a_non_local_host_is_served_with_a_warning(no_server, capsys):
    assert main(["serve", "--fake", "--host", "0.0.0.0", "--port", str(_free_port())]) == 0
    err = capsys.readouterr().err
    assert "warning: listening on 0.0.0.0" in err and "plain HTTP" in err
    assert not no_server[0].public_url.startswith("http://0.0.0.0")  # a browser elsewhere cannot open that


def test_more_sessions_than_fit_are_allowed_with_a_warning(no_server, capsys, monkeypatch):
    monkeypatch.setattr(serve, "available_memory", lambda: 2 * serve.APP_BYTES + 2 * serve.ENGINE_BYTES)
    assert main(["serve", "--fake", "--port", str(_free_port()), "--max-sessions", "5"]) == 0
    assert "--max-sessions 5 is more than this machine holds (1:" in capsys.readouterr().err
    assert "--limit 5" in no_server[0].command


def test_local_hosts_and_urls():
    assert serve.is_local("127.0.0.1") and serve.is_local("::1") and serve.is_local("localhost")
    assert not serve.is_local("0.0.0.0") and not serve.is_local("::") and not serve.is_local("192.0.2.1")
    assert serve.public_url("::1", 80, None) == "http://[::1]:80"
    assert serve.public_url("0.0.0.0", 8000, None) == f"http://{socket.getfqdn()}:8000"
    assert serve.public_url("0.0.0.0", 8000, "https://chat.example/") == "https://chat.example"


@pytest.mark.parametrize(("given", "normal"), [
    ("HTTPS://Chat.Example/", "https://chat.example"),
    ("http://[::1]:8000/", "http://[::1]:8000"),
    ("https://chat.example/app/", "https://chat.example/app"),  # a proxy that serves it under a path
    ("http://10.0.0.1:", "http://10.0.0.1"),
    ("https://chat.example.:8443/a%20b", "https://chat.example.:8443/a%20b"),
])
def test_a_public_url_is_accepted_normalised_and_its_origin_passes(given, normal):
    """What passes --public-url (the bad forms: tests/bad_input/cases.py, serve-public-url-*): the scheme and host
    in lower case, as browsers send them in Origin, so the guard's comparison holds."""
    from aiohttp.test_utils import make_mocked_request

    from specchat.serve_guard import public_url

    assert public_url(given) == normal
    assert parsed("serve", "--public-url", given).public_url == normal
    origin = normal.split("/", 3)[:3]
    guard = Guard.for_address("127.0.0.1", normal, token="t")
    request = make_mocked_request("GET", "/?token=t", headers={"Host": "127.0.0.1:8000", "Origin": "/".join(origin)})
    assert guard.refusal(request) is None


# the session limit ---------------------------------------------------------------------------------
GB = 2**30


@pytest.mark.parametrize(("per", "free", "cores", "fits"), [
    (1 * GB, 16 * GB, 2, 2),  # memory for 12: the cores bound it
    (1 * GB, 16 * GB, None, 12),  # on a GPU device the cores do not
    (2 * GB, 3 * GB, 8, 1),  # a small machine: one engine
    (4 * GB, 1 * GB, 8, 1),  # not even one fits: one all the same (as `run` would try)
    (1 * GB, None, None, 1),  # nothing known: one
    (1 * GB, None, 4, 4),
])
def test_session_budget(per, free, cores, fits):
    budget = SessionBudget(per, free, cores)
    assert budget.fits == fits
    assert "each session needs about" in budget.describe()


def test_the_budget_counts_the_model_weights(monkeypatch, tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)
    monkeypatch.setattr(serve, "available_memory", lambda: 64 * GB)
    fake = parsed("serve", "--fake")
    assert serve.session_budget(fake).per_session == serve.APP_BYTES + serve.ENGINE_BYTES
    monkeypatch.setattr("engine.models.resolve.resolve_model",
                        lambda *a, **k: argparse.Namespace(path=str(tmp_path), gguf=None))
    real = parsed("serve", str(tmp_path), "--device", "cpu")
    assert serve.weight_bytes(real) == 4096


@pytest.mark.parametrize(("gpu_free", "host_free", "fits", "bound"), [
    (3 * GB, 100 * GB, 1, 3 * GB),  # the GPU holds one engine (2 GB each)
    (80 * GB, 8 * GB, 2, 8 * GB),  # the host holds two apps (3 GB each with the app process)
])
def test_on_a_gpu_the_smaller_memory_bounds_the_sessions_not_the_cores(monkeypatch, gpu_free, host_free, fits, bound):
    import torch

    monkeypatch.setattr("engine.loader.pick_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (gpu_free, 80 * GB))
    monkeypatch.setattr(serve, "weight_bytes", lambda args: GB)
    monkeypatch.setattr(serve, "ENGINE_BYTES", GB // 2)
    monkeypatch.setattr(serve, "APP_BYTES", GB)
    monkeypatch.setattr(serve, "available_memory", lambda: host_free)
    budget = serve.session_budget(parsed("serve", "a-model", "--device", "cuda"))
    assert (budget.fits, budget.available, budget.cores) == (fits, bound, None)


def test_slots_are_held_until_released(tmp_path):
    first, second = acquire_slot(tmp_path, 2), acquire_slot(tmp_path, 2)
    assert first is not None and second is not None and {first.index, second.index} == {0, 1}
    assert acquire_slot(tmp_path, 2) is None
    assert wait_for_slot(tmp_path, 2, grace_s=0) is None
    first.release()
    again = acquire_slot(tmp_path, 2)
    assert again is not None and again.index == first.index
    again.release()
    second.release()


def test_a_slot_is_held_across_exec_and_freed_when_the_session_dies(tmp_path):
    """A tab's process takes a slot and becomes ``specchat run`` (exec): the lock stays with the app; when
    that process dies, however, the kernel drops it, so a crashed or killed tab never keeps its slot."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from specchat.serve_session import acquire_slot
        slot = acquire_slot(Path({str(tmp_path)!r}), 1)
        os.set_inheritable(slot.fd, True)
        os.execv(sys.executable, [sys.executable, "-c", "import time; print('held', flush=True); time.sleep(60)"])
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert acquire_slot(tmp_path, 1) is None
    finally:
        holder.kill()
        holder.wait()
    slot = acquire_slot(tmp_path, 1)
    assert slot is not None
    slot.release()


def test_a_tab_beyond_the_limit_gets_the_refusal_app(tmp_path, monkeypatch):
    held = acquire_slot(tmp_path, 1)
    shown: list[str] = []
    monkeypatch.setattr(serve_session, "GRACE_S", 0.0)
    monkeypatch.setattr(RefusalApp, "run", lambda self: shown.append(self.text))
    monkeypatch.setattr(serve_session.os, "execv", lambda path, argv: pytest.fail(f"an engine started: {argv}"))
    assert serve_session.main(["--slots", str(tmp_path), "--limit", "1", "--note", "why", "--", "--fake"]) == 0
    assert shown == [refusal_text(1, "why")]
    held.release()


def test_a_tab_with_a_free_slot_becomes_specchat_run_holding_it(tmp_path, monkeypatch):
    taken: list[serve_session.Slot] = []
    real_wait = serve_session.wait_for_slot
    monkeypatch.setattr(serve_session, "wait_for_slot", lambda *a, **k: taken.append(real_wait(*a, **k)) or taken[-1])
    became: list[list[str]] = []

    def exec_(path: str, argv: list[str]) -> None:
        became.append(argv)
        assert acquire_slot(tmp_path, 1) is None and os.get_inheritable(taken[0].fd)  # kept across the exec

    monkeypatch.setattr(serve_session.os, "execv", exec_)
    assert serve_session.main(["--slots", str(tmp_path), "--limit", "1", "--", "--fake", "--", "m"]) == 0
    assert became == [[sys.executable, "-m", "specchat", "run", "--fake", "--", "m"]]
    taken[0].release()


def test_refusal_text_names_the_limit_and_what_to_do():
    text = refusal_text(2, "each session needs about 1.2 GB")
    assert "2 browser tabs have an engine already" in text and "1.2 GB" in text
    assert "--max-sessions" in text and "reload" in text
    assert "one browser tab has" in refusal_text(1, "")


def test_two_tabs_never_record_into_one_trace():
    args = ["--fake", "--record", "out/t.jsonl", "--", "m"]
    assert record_for_slot(args, 0) == args
    assert record_for_slot(args, 2) == ["--fake", "--record", "out/t.session2.jsonl", "--", "m"]
    assert record_for_slot(["--fake"], 3) == ["--fake"]


async def test_the_refusal_app_shows_why_and_closes_on_q():
    app = RefusalApp(refusal_text(1, "each session needs about 800 MB"))
    async with app.run_test(size=(80, 24)) as pilot:
        shown = str(app.query_one("#refusal").render())
        assert "no engine free" in shown and "800 MB" in shown
        await pilot.press("q")
    assert app.return_code == 0


def test_the_slots_folder_is_the_servers_own(no_server):
    assert main(["serve", "--fake", "--port", str(_free_port())]) == 0
    words = shlex.split(no_server[0].command)
    slots = Path(words[words.index("--slots") + 1])
    assert slots.name.startswith("specchat-serve-") and not slots.exists()  # removed when the server stops


# who may talk to the server (specchat.serve_guard) ---------------------------------------------
@pytest.fixture
async def guarded():
    """The real aiohttp app of ``SpecchatServer`` (textual-serve's routes and the guard) on a test server;
    each tab runs ``true``, so an accepted WebSocket starts nothing. Yields (client, guard, port)."""
    from aiohttp import CookieJar
    from aiohttp.test_utils import TestClient, TestServer

    port = _free_port()
    server = serve.SpecchatServer("true", host="127.0.0.1", port=port, public_url=f"http://127.0.0.1:{port}")
    server.guard = Guard.for_address("127.0.0.1", None)
    client = TestClient(TestServer(await server._make_app(), host="127.0.0.1", port=port),
                        cookie_jar=CookieJar(unsafe=True))  # unsafe: keep cookies of an IP address, as browsers do
    started = []
    frames = server._process_messages

    async def keeping(websocket, app_service):
        started.append(app_service)
        await frames(websocket, app_service)

    server._process_messages = keeping
    await client.start_server()
    try:
        yield client, server.guard, port
    finally:
        await client.close()
        for service in started:  # each tab's `true` reaped in this loop, not when the loop is gone (a warning)
            process = getattr(service, "_process", None)
            if process is not None:
                await process.wait()


async def _ws_status(client, headers: dict[str, str], query: str = "") -> int:
    """The HTTP status of a WebSocket handshake to /ws (101 when it opened)."""
    from aiohttp import WSServerHandshakeError

    try:
        ws = await client.ws_connect(f"/ws{query}", headers=headers)
    except WSServerHandshakeError as exc:
        return exc.status
    await ws.close()
    return 101


async def test_a_websocket_from_another_page_or_without_an_origin_is_refused(guarded):
    client, guard, port = guarded
    token = f"?token={guard.token}"
    assert await _ws_status(client, {"Origin": "http://attacker.example"}, token) == 403
    assert await _ws_status(client, {"Origin": "http://localhost:3000"}, token) == 403  # another local page
    assert await _ws_status(client, {}, token) == 403  # no Origin
    assert await _ws_status(client, {"Origin": f"http://127.0.0.1:{port}"}, "") == 403  # no token
    assert await _ws_status(client, {"Origin": f"http://127.0.0.1:{port}"}, token) == 101  # its own page


async def test_a_foreign_host_is_refused_on_every_request(guarded):
    """DNS rebinding: a page on attacker.example re-pointed at 127.0.0.1 still sends its own name as Host."""
    client, guard, port = guarded
    for path in (f"/?token={guard.token}", "/static/js/textual.js", "/ws"):
        response = await client.get(path, headers={"Host": f"attacker.example:{port}"})
        body = await response.text()
        assert response.status == 403 and body.count("\n") == 1 and "Host" in body, (path, body)


@pytest.mark.parametrize("query", ["", "?token=wrong", "?fontsize=20"])
async def test_a_request_without_the_secret_is_refused(guarded, query):
    client, _, _ = guarded
    for path in ("/", "/static/js/textual.js"):
        response = await client.get(f"{path}{query}")
        body = await response.text()
        assert response.status == 403 and "token" in body and body.count("\n") == 1, (path, body)


async def test_the_printed_address_opens_the_page_and_its_cookie_carries_the_secret(guarded):
    """The browser flow: the URL with the token sets a cookie; the page's files and socket then pass with it."""
    client, guard, port = guarded
    response = await client.get(f"/?token={guard.token}")
    assert response.status == 200 and "textual.js" in await response.text()
    cookie = response.cookies[guard.cookie_name_for(port)]
    assert cookie.value == guard.token and cookie["httponly"] and cookie["samesite"] == "Strict"
    assert not cookie["secure"]  # plain http on the loopback: a Secure cookie would never come back
    assert response.headers["Referrer-Policy"] == "no-referrer"  # the token never leaves in a Referer
    assert (await client.get("/static/js/textual.js")).status == 200  # the client kept the cookie
    assert await _ws_status(client, {"Origin": f"http://127.0.0.1:{port}"}) == 101


@pytest.mark.parametrize(("host", "public", "request_host", "origin", "ok"), [
    ("127.0.0.1", None, "127.0.0.1:8000", "http://127.0.0.1:8000", True),
    ("127.0.0.1", None, "localhost:8000", "http://localhost:8000", True),
    ("127.0.0.1", None, "[::1]:8000", None, True),
    ("127.0.0.1", None, "localhost:8000", "http://127.0.0.1:8000", False),  # Origin of another page
    ("127.0.0.1", None, "192.168.1.5:8000", None, False),
    ("127.0.0.1", None, "", None, False),
    ("0.0.0.0", None, "192.168.1.5:8000", "http://192.168.1.5:8000", True),  # an interface of the machine
    ("0.0.0.0", None, "evil.example:8000", None, False),
    ("127.0.0.1", "https://chat.example/", "chat.example", "https://chat.example", True),  # a proxy in front
    ("127.0.0.1", "https://chat.example/", "127.0.0.1:8000", "https://chat.example", True),  # Host rewritten
    ("127.0.0.1", "https://chat.example/", "127.0.0.1:8000", "http://chat.example", False),  # wrong scheme/port
])
def test_which_hosts_and_origins_pass(host, public, request_host, origin, ok):
    from aiohttp.test_utils import make_mocked_request

    guard = Guard.for_address(host, public, token="s3cret")
    headers = {"Host": request_host, **({"Origin": origin} if origin else {})}
    request = make_mocked_request("GET", "/?token=s3cret", headers=headers)
    assert (guard.refusal(request) is None) == ok, guard.refusal(request)


def test_each_launch_has_its_own_secret():
    first, second = Guard.for_address("127.0.0.1", None), Guard.for_address("127.0.0.1", None)
    assert first.token != second.token and len(first.token) >= 32
    assert first.url("http://127.0.0.1:8000/") == f"http://127.0.0.1:8000/?token={first.token}"


async def test_behind_an_https_proxy_the_cookie_is_secure():
    """With --public-url https://..., the token's cookie is marked Secure (never sent over plain http)."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    guard = Guard.for_address("127.0.0.1", "https://chat.example/")
    app = web.Application(middlewares=[guard.middleware()])
    app.router.add_get("/", lambda request: web.Response(text="page"))
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        response = await client.get(f"/?token={guard.token}", headers={"Host": "chat.example"})
        assert response.status == 200
        assert "Secure" in response.headers["Set-Cookie"]
    finally:
        await client.close()


# the console: one short line per thing gone wrong, never the token; a clean stop ----------------
def _start_server(*flags: str, **popen: object) -> tuple[subprocess.Popen, int, str, str]:
    """``specchat serve --fake`` in a subprocess, once it listens: (process, port, token, banner)."""
    import re
    import time

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "specchat", "serve", "--fake", "--port", str(port), *flags],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)
    banner = server.stdout.readline()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    found = re.search(r"\?token=([\w-]+)", banner)
    assert found, banner
    return server, port, found.group(1), banner


def _exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` on a fresh connection; the answer's status line (or b"" when the server closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with contextlib.suppress(OSError):  # the server may answer and close before all of it is sent
            sock.sendall(request)
        try:
            return sock.makefile("rb").readline().strip()
        except OSError:
            return b""


def _stopped(server: subprocess.Popen, group: bool = False) -> tuple[int, str]:
    """Ctrl+C to the server (to its whole process group, as a terminal sends it, with ``group``): (code, console)."""
    (os.killpg if group else os.kill)(server.pid, signal.SIGINT)
    try:
        out, _ = server.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL) if group else server.kill()
        out, _ = server.communicate()
        pytest.fail(f"no stop within 30 s after Ctrl+C:\n{out[-2000:]}")
    return server.returncode, out


def test_bad_requests_get_a_4xx_and_one_console_line_without_the_token():
    """A 64 KB URL or header, a bad Content-Length, bytes that are no HTTP, HEAD, OPTIONS, an unknown path, a path
    out of the static folder, a client gone mid-answer: each gets its 4xx (or its page), and the console at most
    one short line, never the token or the request (it printed a fifty-line traceback quoting the URL)."""
    server, port, token, _ = _start_server()
    host = f"Host: 127.0.0.1:{port}\r\n".encode()
    path = f"/?token={token}".encode()
    try:
        answers = {
            "long url": _exchange(port, b"GET " + path + b"&x=" + b"a" * 65536 + b" HTTP/1.1\r\n" + host + b"\r\n"),
            "long header": _exchange(port, b"GET " + path + b" HTTP/1.1\r\n" + host + b"X-Big: " + b"a" * 65536
                                     + b"\r\n\r\n"),
            "bad length": _exchange(port, b"POST " + path + b" HTTP/1.1\r\n" + host + b"Content-Length: abc\r\n\r\n"),
            "negative length": _exchange(port, b"POST " + path + b" HTTP/1.1\r\n" + host
                                         + b"Content-Length: -1\r\n\r\n"),
            "no http": _exchange(port, b"\x16\x03\x01\x02\x00garbage\r\n\r\n"),
            "head": _exchange(port, b"HEAD " + path + b" HTTP/1.1\r\n" + host + b"\r\n"),
            "options": _exchange(port, b"OPTIONS " + path + b" HTTP/1.1\r\n" + host + b"\r\n"),
            "unknown path": _exchange(port, b"GET /nope?token=" + token.encode() + b" HTTP/1.1\r\n" + host + b"\r\n"),
            "out of static": _exchange(port, b"GET /static/../../../etc/passwd?token=" + token.encode()
                                       + b" HTTP/1.1\r\n" + host + b"\r\n"),
        }
        with socket.create_connection(("127.0.0.1", port), timeout=5) as gone:  # leaves before the answer ends
            gone.sendall(b"GET /static/js/textual.js?token=" + token.encode() + b" HTTP/1.1\r\n" + host + b"\r\n")
        assert _exchange(port, b"GET " + path + b" HTTP/1.1\r\n" + host + b"\r\n").startswith(b"HTTP/1.1 200")
    finally:
        code, console = _stopped(server)
    status = {what: int(line.split()[1]) if line else None for what, line in answers.items()}
    assert all(400 <= status[w] < 500 for w in ("long url", "long header", "bad length", "negative length",
                                                "no http", "options", "unknown path", "out of static")), status
    assert status["head"] == 200
    lines = console.splitlines()
    assert "Traceback" not in console and token not in console and "aaaa" not in console, console[-3000:]
    assert len(lines) <= 6, console  # a line per unreadable request (4, the bytes that are no HTTP: 0 or 1), the stop
    assert all(len(line) <= serve_server.LINE_CHARS for line in lines), console
    assert all(line.startswith("specchat serve: ") for line in lines), console
    assert lines[-1] == "specchat serve: stopped" and code == 130


def test_ctrl_c_with_a_tab_open_stops_in_one_line():
    """Ctrl+C in the terminal reaches the whole process group: the tabs' apps and engines printed their
    KeyboardInterrupt tracebacks on the server's console. They have their own session now; the server closes
    each tab (its app quits) and says one line, exit 130 as every command on Ctrl+C."""
    import asyncio

    import aiohttp

    server, port, token, _ = _start_server(start_new_session=True)

    async def open_a_tab() -> None:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(f"http://127.0.0.1:{port}/ws?token={token}",
                                          headers={"Origin": f"http://127.0.0.1:{port}"})
            first = await asyncio.wait_for(ws.receive(), 60)  # the app's first screen: it runs
            assert first.type == aiohttp.WSMsgType.BINARY, first
            code, console = await asyncio.get_running_loop().run_in_executor(None, _stopped, server, True)
            assert "Traceback" not in console and "KeyboardInterrupt" not in console, console[-3000:]
            assert console.splitlines() == ["specchat serve: stopped"] and code == 130, console[-3000:]

    try:
        asyncio.run(open_a_tab())
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def test_ctrl_c_pressed_again_while_stopping_changes_nothing():
    """Ctrl+C held down: the first stops the server, the next ones neither interrupt the stop nor kill the
    process after it (exit status -2, by the signal)."""
    import time

    server, _, _, _ = _start_server(start_new_session=True)
    for pause in (0.01, 0.05, 0.0):
        os.killpg(server.pid, signal.SIGINT)
        time.sleep(pause)
    code, console = _stopped(server, group=True)
    assert (code, console.splitlines()) == (130, ["specchat serve: stopped"]), console[-2000:]


def test_the_console_line_of_an_unreadable_request_holds_nothing_it_sent():
    import logging

    from aiohttp.http_exceptions import LineTooLong

    error = LineTooLong(b"/?token=s3cret&x=" + b"a" * 5000, 8190)
    record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                               ("127.0.0.1",), (LineTooLong, error, None))
    line = serve_server.console_line(record)
    assert line == "specchat serve: refused a request it could not read (LineTooLong, answered 400)"
    thrown = ValueError("frame: s3cret\nsecond line")  # textual-serve logs the exception itself as the message
    record = logging.LogRecord("textual-serve", logging.ERROR, __file__, 1, thrown, (), (ValueError, thrown, None))
    assert serve_server.console_line(record) == "specchat serve: textual-serve failed (ValueError)"
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "a\nb " + "c" * 500, (), None)
    line = serve_server.console_line(record)
    assert "\n" not in line and len(line) == serve_server.LINE_CHARS


@pytest.mark.parametrize("frame", ["garbage{", "42", '{"a": 1}', "[]", "[1]", '["stdin"]', '["stdin", 5]',
                                   '["resize", {"width": "x", "height": 24}]', '["resize", {"width": 99999999, '
                                   '"height": 24}]', '["resize", [80, 24]]', '["ping", {"a": []}]', b"\x00\x01"])
async def test_a_frame_that_is_not_the_pages_is_dropped_in_one_line(guarded, frame, caplog):
    """An authorised socket sending garbage: textual-serve's loop raised on it (a traceback, the tab's socket
    gone). The frame is dropped with one console line, and the page's own frames still work."""
    client, guard, port = guarded
    ws = await client.ws_connect(f"/ws?token={guard.token}", headers={"Origin": f"http://127.0.0.1:{port}"})
    await (ws.send_bytes(frame) if isinstance(frame, bytes) else ws.send_str(frame))
    await ws.send_str(frame if isinstance(frame, str) else "[1]")  # a second bad one: no second line
    await ws.send_str('["ping", "7"]')
    answer = await ws.receive(timeout=10)
    assert answer.type == WSMsgType.TEXT and answer.json() == ["pong", "7"], answer
    await ws.close()
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in said if r.exc_info], caplog.text  # no exception (the tab here runs `true`: it says so)
    assert [serve_server.console_line(r) for r in said if "frame" in r.getMessage()] == [
        "specchat serve: dropped a WebSocket frame that is not the page's (and any more on this tab)"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the binding to the server's life is Linux's prctl")
def test_a_tab_dies_with_a_server_killed_outright():
    """Out of the server's process group (Ctrl+C reaches only the server), a tab must still end when the server
    is killed (kill -9, the OOM killer), or it keeps its model in memory with no one to serve it."""
    import time

    tab = ("from specchat.serve_session import own_session; own_session(); import time; print('bound', flush=True); "
           "time.sleep(60)")
    server = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import subprocess, sys, time
        tab = subprocess.Popen([sys.executable, "-c", {tab!r}])
        print(tab.pid, flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    pid = int(server.stdout.readline())
    assert server.stdout.readline().strip() == "bound"  # the tab's own line (it shares the pipe)
    assert os.getsid(pid) == pid  # a session of its own
    server.kill()
    server.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # not ours (init reaps it), but harmless
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the tab outlived its server")


async def test_a_tab_that_does_not_quit_is_killed_when_the_server_stops(monkeypatch):
    """A tab has its own session (Ctrl+C reaches only the server): one whose app hangs on quit would outlive
    the server, holding its model; STOP_S after the stop it is killed."""
    import time

    from aiohttp.test_utils import TestClient, TestServer

    monkeypatch.setattr(serve_server, "STOP_S", 0.5)
    hang = shlex.join([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                             "print('__GANGLION__', flush=True); time.sleep(60)"])
    server = serve.SpecchatServer(f"exec {hang}", host="127.0.0.1", port=0)
    server.guard = Guard.for_address("127.0.0.1", None)
    app = await server._make_app()
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    port = client.server.port
    ws = await client.ws_connect(f"/ws?token={server.guard.token}", headers={"Origin": f"http://127.0.0.1:{port}"})
    for _ in range(100):
        if server.tabs and getattr(next(iter(server.tabs.values())), "_process", None) is not None:
            break
        await asyncio.sleep(0.05)
    [process] = [service._process for service in server.tabs.values()]
    started = time.monotonic()
    await server.on_shutdown(app)
    assert process.returncode == -signal.SIGKILL and time.monotonic() - started < 5
    await ws.close()
    await client.close()


@pytest.mark.parametrize("query", ["width=100000&height=24", "width=80&height=0", "width=-5", "height=x", "width=1e9"])
async def test_a_tab_of_no_screens_size_is_refused(guarded, query):
    """The page's size starts the tab's app (its COLUMNS and ROWS): a million columns is memory, not a screen."""
    client, guard, port = guarded
    assert await _ws_status(client, {"Origin": f"http://127.0.0.1:{port}"}, f"?token={guard.token}&{query}") == 400
    assert await _ws_status(client, {"Origin": f"http://127.0.0.1:{port}"},
                            f"?token={guard.token}&width=120&height=40") == 101


async def test_a_tab_gone_while_its_pong_is_sent_says_nothing(caplog):
    """A tab closed between its ping and the pong: the send fails; textual-serve logged it as an error."""
    from aiohttp import ClientConnectionResetError, WSMessage

    class Gone:
        def __aiter__(self):
            return self

        async def __anext__(self):
            if getattr(self, "sent", False):
                raise StopAsyncIteration
            self.sent = True
            return WSMessage(WSMsgType.TEXT, '["ping", "1"]', None)

        async def send_json(self, data):
            raise ClientConnectionResetError("Cannot write to closing transport")

    server = serve_server.SpecchatServer("true")
    server.tabs = {}
    await server._process_messages(Gone(), object())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
