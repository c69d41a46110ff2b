"""Whether the client of a long poll is still there.

The API's long polls (``POST /api/worker/claim``, the watch) are sync views that wait in
a thread. When the client hangs up (a worker stopping aborts its waiting claim before it
releases its leases), Django cancels the request's task, but the thread waits on: woken
by that very release, the claim would lease the run again to nobody, and the run would
sit ``running`` until the lease ran out.

``HangupMiddleware`` (ASGI, wired in ``config.asgi``) watches the request's ``receive``
channel and sets an event in the scope when ``http.disconnect`` arrives;
``client_gone(request)`` reads it. Under WSGI or the test client there is no scope and the
client is never gone.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.http import HttpRequest

SCOPE_KEY = "holdpoint.client_gone"

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


class HangupMiddleware:
    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gone = threading.Event()

        async def watched() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
            return message

        await self.app({**scope, SCOPE_KEY: gone}, watched, send)


def client_gone(request: HttpRequest) -> bool:
    """True once the client has hung up (ASGI only)."""
    request = getattr(request, "_request", request)  # a DRF Request wraps Django's
    gone = getattr(request, "scope", {}).get(SCOPE_KEY)
    return bool(gone is not None and gone.is_set())
