"""Helpers for the live dashboard's tests: websockets through the real ASGI stack.

Consumers render in threads of their own (``live.consumers``), with their own database
connections, so these tests commit for real (``transaction=True``): what a consumer
reads is what another process would read.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client

from config.asgi import application
from tests.live.server import own_channel_layer, wait_until_no_loop_receives

T = TypeVar("T")
HOST = "localhost"
ORIGIN = f"http://{HOST}"


def session_cookie(user: User) -> str:
    """A signed-in browser's cookies: its session and its CSRF cookie."""
    client = Client()
    client.force_login(user)
    client.get("/login/")  # sets the CSRF cookie, as every page does
    return "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items())


def socket(
    path: str, *, cookie: str | None = None, origin: str | None = ORIGIN
) -> WebsocketCommunicator:
    headers = [(b"host", HOST.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(application, path, headers=headers)


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run an async scenario from a sync test, in a thread of its own: the browser tests'
    Playwright keeps an event loop in the main thread for the rest of the session. ``db``
    calls in the scenario come back to that thread (its own connection: these tests commit)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = async_to_sync(scenario)()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            connections.close_all()

    own_channel_layer()
    thread = threading.Thread(target=target, name="live-scenario")
    thread.start()
    thread.join()
    own_channel_layer()  # the scenario's loop is closed: nobody else starts on its layer
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value


def db(func: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """ORM work inside a scenario, on the test's own thread and connection."""
    return database_sync_to_async(func)


async def pushed(communicator: WebsocketCommunicator, *, within: float = 5.0) -> list[str]:
    """The frames of one push: the first (waited for), and any that follow within 0.3 s."""
    received = [await communicator.receive_from(timeout=within)]
    while not await communicator.receive_nothing(timeout=0.3):
        received.append(await communicator.receive_from())
    return received


async def silent(communicator: WebsocketCommunicator, seconds: float = 0.6) -> bool:
    """Nothing arrives for ``seconds``."""
    return bool(await communicator.receive_nothing(timeout=seconds))


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    # The personas' passwords are never typed here (sockets sign in by session cookie).
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _pushes_sent() -> Iterator[None]:
    # A push still on its way must not land in the next test. (A socket a failed test left
    # in the group only costs messages nobody reads.)
    yield
    from live import broadcast

    broadcast.drain(2.0)


@pytest.fixture(autouse=True)
def _layer_free_of_other_loops() -> None:
    wait_until_no_loop_receives()
