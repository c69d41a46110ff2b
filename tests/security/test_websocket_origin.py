"""Issue 13, finding 6: a live socket opens only from our own origin, scheme, host and port.

Through the real ASGI application (origin check, session, consumer). The application is
rebuilt under each test's ALLOWED_HOSTS, so a check that reads them once at import time
is tested with the same hosts as one that reads them per handshake.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User

import config.asgi
from tests.live.conftest import run, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def application(settings: Any) -> Iterator[Any]:
    hosts, trusted = list(settings.ALLOWED_HOSTS), list(settings.CSRF_TRUSTED_ORIGINS)
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1", ".example.com"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://holdpoint.example.org"]
    module = importlib.reload(config.asgi)
    yield module.application
    settings.ALLOWED_HOSTS, settings.CSRF_TRUSTED_ORIGINS = hosts, trusted
    importlib.reload(config.asgi)


def handshake(application: Any, *, host: str, origin: str | None, scheme: str, cookie: str) -> bool:
    headers = [(b"host", host.encode()), (b"cookie", cookie.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))

    async def scenario() -> bool:
        communicator = WebsocketCommunicator(application, "/ws/live/", headers=headers)
        communicator.scope["scheme"] = scheme
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return bool(connected)

    return run(scenario)


REFUSED = [
    # (Host the socket was opened on, scheme of the socket, Origin of the page)
    pytest.param("localhost:8000", "ws", "http://localhost:9999", id="another-port"),
    pytest.param("localhost:8000", "ws", "http://localhost", id="default-port-vs-8000"),
    pytest.param(
        "holdpoint.example.com", "wss", "https://evil.example.com", id="sibling-subdomain"
    ),
    pytest.param(
        "holdpoint.example.com", "wss", "http://holdpoint.example.com", id="http-vs-https"
    ),
    pytest.param("localhost:8000", "ws", "https://localhost:8000", id="https-vs-http"),
    pytest.param("localhost:8000", "ws", "http://evil.example", id="another-site"),
    pytest.param("localhost:8000", "ws", "null", id="opaque-origin"),
    pytest.param("localhost:8000", "ws", None, id="no-origin"),
    pytest.param("evil.example", "ws", "http://evil.example", id="host-not-allowed"),
]

ALLOWED = [
    pytest.param("localhost:8000", "ws", "http://localhost:8000", id="same-origin"),
    pytest.param("LOCALHOST:8000", "ws", "http://localhost:8000", id="case-of-the-host"),
    pytest.param(
        "holdpoint.example.com", "wss", "https://holdpoint.example.com", id="same-origin-tls"
    ),
    pytest.param(
        "holdpoint.example.com:443", "wss", "https://holdpoint.example.com", id="default-port"
    ),
    pytest.param("127.0.0.1:8001", "ws", "https://holdpoint.example.org", id="csrf-trusted-origin"),
]


@pytest.mark.parametrize(("host", "scheme", "origin"), REFUSED)
def test_it_refuses_a_socket_from_another_origin(
    application: Any, operator: User, host: str, scheme: str, origin: str | None
) -> None:
    cookie = session_cookie(operator)
    assert not handshake(application, host=host, origin=origin, scheme=scheme, cookie=cookie)


@pytest.mark.parametrize(("host", "scheme", "origin"), ALLOWED)
def test_it_lets_our_own_page_open_a_socket(
    application: Any, operator: User, host: str, scheme: str, origin: str
) -> None:
    cookie = session_cookie(operator)
    assert handshake(application, host=host, origin=origin, scheme=scheme, cookie=cookie)
