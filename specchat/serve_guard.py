"""Who may talk to ``specchat serve``: its own address, from its own page, with this launch's secret.

The server drives a whole chat app (saved conversations, the model, the machine's CPU) from
whatever opens its WebSocket. A browser lets any web page open a WebSocket to 127.0.0.1 and does
not stop it by itself, so three checks guard every request, as Jupyter's do:

- **Host** must name an address the server serves: a page on ``attacker.example`` that re-points
  its DNS name at 127.0.0.1 (DNS rebinding) still sends ``Host: attacker.example``.
- **Origin** must be the server's own (the page it served), and a WebSocket must send one: any
  other page's socket, or a script outside a browser that forgot it, is refused.
- **The secret** of this launch (:func:`secrets.token_urlsafe`), in the URL the server prints
  (``?token=...``): the first page load sets it as an HttpOnly cookie, which the browser then
  sends with the page's static files and its WebSocket. Another user of the machine, or a page
  that guessed the port, does not have it.

Anything else gets a plain 403 with a one-line body that says why.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import hdrs, web

TOKEN_PARAM = "token"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def new_token() -> str:
    """A fresh secret for one launch of the server (never stored: a restart makes the old URL useless)."""
    return secrets.token_urlsafe(32)


def _host_and_port(netloc: str) -> tuple[str, int | None] | None:
    """``netloc`` (``name``, ``name:port``, ``[v6]:port``) as a lower-case name and a port; None if malformed."""
    try:
        parts = urlsplit(f"//{netloc}")
        return (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None


def _origin(value: str) -> tuple[str, str, int | None] | None:
    """An Origin header (or a URL) as (scheme, name, port), the scheme's default port left out (as in Host)."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), None if port == DEFAULT_PORTS[parts.scheme] else port


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Guard:
    """The addresses this server answers to and its secret; :meth:`refusal` judges one request.

    ``names`` are the host names (and IP literals) a browser may use to reach the server;
    ``any_ip`` accepts every IP literal too (a server listening on every interface, reached by
    one of its addresses: an IP literal cannot be DNS-rebound). ``public`` is ``--public-url``'s
    origin (scheme, name, port): a proxy in front may pass on the server's Host, and its page's
    Origin is that address.
    """

    token: str
    names: frozenset[str]
    any_ip: bool = False
    public: tuple[str, str, int | None] | None = None

    @classmethod
    def for_address(cls, host: str, public_url: str | None, token: str | None = None) -> Guard:
        """The guard for a server listening on ``host``, announced as ``public_url`` (None: none given)."""
        host = host.lower()
        names = {host}
        wildcard = host in WILDCARD_HOSTS
        if wildcard or host in LOOPBACK_NAMES or _is_loopback(host):
            names |= LOOPBACK_NAMES
        if wildcard:
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        public = _origin(public_url) if public_url else None
        if public is not None:
            names.add(public[1])
        return cls(token or new_token(), frozenset(names - {""}), any_ip=wildcard, public=public)

    def url(self, base: str) -> str:
        """The address to print: ``base`` with this launch's secret, e.g. ``http://127.0.0.1:8000/?token=...``."""
        return f"{base.rstrip('/')}/?{TOKEN_PARAM}={self.token}"

    @staticmethod
    def cookie_name_for(port: int | None) -> str:
        """One cookie per port: cookies are not kept apart by port, two servers on one machine would clash."""
        return f"specchat-serve-{port or 0}"

    def cookie_name(self, request: web.Request) -> str:
        """The cookie for the port the browser sees (the Host it sends: a proxy's, where there is one)."""
        parsed = _host_and_port(request.host)
        return self.cookie_name_for(parsed[1] if parsed else None)

    def _host_ok(self, name: str) -> bool:
        return name in self.names or (self.any_ip and _is_ip(name))

    def refusal(self, request: web.Request) -> str | None:
        """Why ``request`` is refused (one line), or None when it may pass."""
        host = request.headers.get(hdrs.HOST)
        parsed = _host_and_port(host) if host else None
        if parsed is None or not self._host_ok(parsed[0]):
            return f"specchat serve: refused: Host {host!r} is not this server's address"
        origin = request.headers.get(hdrs.ORIGIN)
        websocket = request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"
        if origin is None and websocket:
            return "specchat serve: refused: a WebSocket without an Origin"
        if origin is not None and not self._origin_ok(_origin(origin), parsed):
            return f"specchat serve: refused: Origin {origin!r} is not this server's page"
        if not self._has_token(request):
            return ("specchat serve: refused: no valid token; open the address the server printed "
                    "(it ends in ?token=...)")
        return None

    def _origin_ok(self, origin: tuple[str, str, int | None] | None, host: tuple[str, int | None]) -> bool:
        """The page's own origin: the address the request came to (Host), or the public URL."""
        return origin is not None and (origin[1:] == host or origin == self.public)

    def _has_token(self, request: web.Request) -> bool:
        given = request.query.get(TOKEN_PARAM) or request.cookies.get(self.cookie_name(request)) or ""
        return secrets.compare_digest(given.encode(), self.token.encode())

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        """An aiohttp middleware: refuses with a plain 403, and hands the page that came with the
        token in its URL a cookie holding it (for the page's own WebSocket and static files)."""

        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            why = self.refusal(request)
            if why is not None:
                return web.Response(status=403, text=why + "\n")
            response = await handler(request)
            # the token never leaves in a Referer (the page's links, its fetches)
            response.headers.setdefault("Referrer-Policy", "no-referrer")
            if TOKEN_PARAM in request.query and isinstance(response, web.Response):
                response.set_cookie(self.cookie_name(request), self.token, httponly=True, samesite="Strict",
                                    path="/", secure=self.public is not None and self.public[0] == "https")
            return response

        return guard


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
