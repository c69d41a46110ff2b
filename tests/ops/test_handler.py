"""config/handler.py: under ASGI each request is served in one thread of a reused pool,
with the middleware chain sync, as a WSGI server serves it."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from channels.testing import HttpCommunicator
from django.test import override_settings

import config.asgi
from config.handler import PooledASGIHandler
from tests.live.conftest import run


@override_settings(DEBUG=True)  # Django says which handlers it adapts only with DEBUG on
def test_no_middleware_and_no_handler_is_adapted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="django.request")
    PooledASGIHandler()
    assert [r.getMessage() for r in caplog.records if "adapted" in r.getMessage()] == []


def get(path: str) -> dict[str, Any]:
    async def scenario() -> dict[str, Any]:
        communicator = HttpCommunicator(
            config.asgi.application, "GET", path, headers=[(b"host", b"localhost")]
        )
        return await communicator.get_response()

    return run(scenario)


def pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("web_")]


@pytest.mark.django_db(transaction=True)
def test_requests_one_after_another_are_served_by_reused_threads() -> None:
    get("/api/no-such-route")
    before = {t.ident for t in pool_threads()}  # earlier tests' live servers use the pool too
    assert before
    for _ in range(20):
        response = get("/api/no-such-route")
        assert response["status"] == 404
        assert (b"Content-Type", b"application/problem+json") in response["headers"]
    # Django's own handler starts a new thread for every request. Here a thread is
    # reused once it is idle (one may still be finishing when the next request comes).
    assert len({t.ident for t in pool_threads()} - before) <= 2


@pytest.mark.django_db(transaction=True)
def test_a_view_that_awaits_the_channel_layer_still_can() -> None:
    # healthz runs async_to_sync (a channel-layer round trip) inside the sync view: it
    # must reach the server's event loop from the pool thread.
    response = get("/healthz")
    assert response["status"] == 200, response["body"]
    assert b'"channel_layer": "ok"' in response["body"]
