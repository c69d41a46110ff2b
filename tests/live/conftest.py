"""Helpers for the live dashboard's tests: websockets through the real ASGI stack.

Consumers render in threads of their own (``runs.consumers``), with their own database
connections, so these tests commit for real (``transaction=True``): what a consumer
reads is what another process would read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from config.asgi import application

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
    """Run an async scenario from a sync test; ``db`` calls in it come back to this thread."""
    return async_to_sync(scenario)()


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
def _empty_channel_layer() -> Iterator[None]:
    yield
    from runs import broadcast

    broadcast.drain(2.0)
    layer: Any = get_channel_layer()
    # Only the in-memory layer: channels_redis' flush also closes the connections that the
    # push thread's event loop holds (from this loop, which fails). A socket a failed test
    # left in a Redis group only costs messages that expire.
    if isinstance(layer, InMemoryChannelLayer) and not _loop_running():
        async_to_sync(layer.flush)()


def _loop_running() -> bool:
    """Playwright's loop runs in browser tests' thread (and the live server uses the layer)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
