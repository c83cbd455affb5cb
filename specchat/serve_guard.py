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
import re
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
MAX_URL_CHARS = 2048  # --public-url goes into every page the server sends
DNS_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
URL_PATH = re.compile(r"(?:/(?:[A-Za-z0-9._~!$&*+,;=:@-]|%[0-9A-Fa-f]{2})*)*")  # no quote, bracket or angle

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


def public_url(text: str) -> str:
    """``--public-url`` checked and normalised (lower-case scheme and host, no trailing slash), else ValueError.

    Why so strict: the server prints this address for the user to open, writes it into every page
    as the base of the page's script and WebSocket URLs, and accepts its host as a Host and its
    origin as an Origin. So only an http(s) address a browser opens as a page passes: a host name
    or an IP literal (IPv6 in brackets), an optional port and path, nothing else (no user or
    password, no query or fragment, no spaces or control characters, which urlsplit would drop
    silently, no 0.0.0.0, which names no machine).
    """
    if len(text) > MAX_URL_CHARS:
        raise ValueError(f"longer than {MAX_URL_CHARS} characters; give the address browsers open, "
                         "e.g. https://chat.example")
    if not text.isascii() or not text.isprintable() or " " in text:
        raise ValueError(f"{text!r} holds spaces, control or non-ASCII characters (write a non-ASCII host "
                         "name as xn--...); give the address browsers open, e.g. https://chat.example")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:  # a bad port, a bracketed host that is no IPv6 address
        raise ValueError(f"{text!r} is not a valid URL ({exc}); an IPv6 address goes in brackets and a port "
                         "is 1 to 65535, e.g. http://[::1]:8000") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not text[len(scheme):].startswith("://"):
        raise ValueError(f"{text!r} is not an http:// or https:// address; give the address browsers open, "
                         "e.g. https://chat.example or http://myhost:8000")
    if "@" in parts.netloc:
        raise ValueError(f"{text!r} holds a user name or password; give the address without them")
    if parts.query or parts.fragment or text.endswith(("?", "#")):
        raise ValueError(f"{text!r} holds a query or fragment (?... #...); give the address without them "
                         "(the server adds its own ?token=...)")
    host = (parts.hostname or "").lower()
    if not _is_host(host, bracketed=parts.netloc.startswith("[")):
        raise ValueError(f"{text!r} has no valid host; give a host name or an IP address (IPv6 in brackets), "
                         "e.g. https://chat.example or http://[::1]:8000")
    if host in WILDCARD_HOSTS:
        raise ValueError(f"{text!r}: {host} names no machine a browser can open; give this machine's name "
                         "or one of its addresses")
    if port == 0:
        raise ValueError(f"{text!r}: port 0 is no port; choose one from 1 to 65535")
    if "\\" in text or not URL_PATH.fullmatch(parts.path):
        raise ValueError(f"{text!r}: its path holds characters a URL path cannot (quotes, brackets, a backslash...); "
                         "percent-encode them or leave the path out")
    netloc = parts.netloc.lower().rstrip(":")
    return f"{scheme}://{netloc}{parts.path}".rstrip("/")


def _is_host(name: str, bracketed: bool) -> bool:
    """A host a browser opens: an IPv6 literal (only in brackets), an IPv4 literal, or DNS labels."""
    if bracketed or ":" in name:
        return bracketed and _is_ip(name) and "%" not in name  # a zone id (fe80::1%eth0): no browser takes it
    labels = name.removesuffix(".").split(".")
    if labels[-1].isdigit():  # all digits at the end: meant as an IPv4 address (1.2.3.4.5 is none)
        return _is_ip(name.removesuffix("."))
    return all(DNS_LABEL.fullmatch(label) for label in labels)


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
