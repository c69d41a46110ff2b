"""The origin check of the live sockets: only our own pages may open one.

A browser sends a websocket handshake to any site with that site's cookies, whatever
page asked for it, so the handshake's ``Origin`` is the only thing that tells our page
from another. Channels' ``AllowedHostsOriginValidator`` compares host names only: a page
on another port of the same host (``http://localhost:9999``), a sibling subdomain
allowed by a ``.example.com`` entry, or plain ``http://`` next to our ``https://`` would
pass it and read the user's pushes.

The rule here is the one Django's CSRF check applies to unsafe requests (an origin of
scheme, host and port): the handshake's ``Origin`` must be the origin of the request
itself (``https://`` + ``Host`` for ``wss``, ``http://`` + ``Host`` for ``ws``, the
default port when none is written), with a ``Host`` that ``ALLOWED_HOSTS`` accepts, or
be one of ``CSRF_TRUSTED_ORIGINS`` (full origins, e.g. ``https://holdpoint.example.com``;
``https://*.example.com`` allows subdomains only when written so). No ``Origin`` at all
is refused: browsers always send one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}
# What Django itself allows when DEBUG is on and ALLOWED_HOSTS is empty (HttpRequest.get_host).
DEBUG_HOSTS = [".localhost", "127.0.0.1", "[::1]"]


def _origin_tuple(value: str) -> tuple[str, str, int] | None:
    """``(scheme, host, port)`` of an origin such as ``https://example.com:8443``, or None."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not host:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return None
    return scheme, host, port if port is not None else DEFAULT_PORTS[scheme]


def _trusted(origin: tuple[str, str, int], trusted: Iterable[str]) -> bool:
    scheme, host, port = origin
    for entry in trusted:
        wildcard = "://*." in entry
        allowed = _origin_tuple(entry.replace("://*.", "://", 1))
        if allowed is None:
            continue
        a_scheme, a_host, a_port = allowed
        if (a_scheme, a_port) != (scheme, port):
            continue
        if host == a_host or (wildcard and host.endswith("." + a_host)):
            return True
    return False


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    values = [value for key, value in scope.get("headers", []) if key.lower() == name]
    if len(values) != 1:
        return None  # Missing, or sent twice: refuse rather than guess which one counts.
    try:
        return bytes(values[0]).decode("ascii")
    except UnicodeDecodeError:
        return None


def origin_allowed(scope: dict[str, Any]) -> bool:
    """Whether the websocket handshake in ``scope`` comes from one of our own pages."""
    raw_origin = _header(scope, b"origin")
    if raw_origin is None:
        return False
    origin = _origin_tuple(raw_origin)
    if origin is None:
        return False
    if _trusted(origin, settings.CSRF_TRUSTED_ORIGINS):
        return True
    raw_host = _header(scope, b"host")
    if raw_host is None:
        return False
    domain, _ = split_domain_port(raw_host)
    allowed_hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = DEBUG_HOSTS
    if not domain or not validate_host(domain, allowed_hosts):
        return False
    # The request's own origin: daphne reports wss (or https behind a proxy that says so
    # with --proxy-headers) for a TLS handshake.
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    own = _origin_tuple(f"{scheme}://{raw_host}")
    return own is not None and own == origin


class SameOriginValidator:
    """ASGI middleware: refuse (close before accept) a websocket whose Origin is not ours."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator guards websockets only.")
        if not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
