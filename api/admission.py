"""Admission control: past what a web process can serve, refuse at once with a 503.

An ASGI middleware in front of Django (``config/asgi.py``), one per web process. It counts
the HTTP requests the process is serving and, past a limit, answers a new one at once,
on the event loop, without a thread, a database connection or a look at the body::

    503 application/problem+json  Retry-After: 1
    {"code": "overloaded", "retry_after": 1, "limit": 64, ...}

A refused request has run no code of ours: nothing changed, and the same request (with
the same ``Idempotency-Key``) may simply be sent again after ``Retry-After`` seconds,
which is what the clients (``holdpoint_client``, the TypeScript client, ``bench.capacity``)
do. The connection stays open for that retry: the body is read and dropped first.

Two budgets per process, because they hold different things:

- ``HOLDPOINT_WEB_MAX_INFLIGHT`` (default 64): requests being served. Each holds a thread
  and, while it runs, one of the ``DATABASE_POOL_SIZE`` pooled connections; past the limit
  a request would only queue for a connection (up to ``DATABASE_POOL_TIMEOUT``) and make
  every other request later. A few times the pool keeps the pool busy and the wait short.
- ``HOLDPOINT_WEB_MAX_LONG_POLLS`` (default 512): long polls (``POST /api/worker/claim``,
  ``POST /api/worker/attempts/{id}/watch``). Each holds a thread while it waits, and takes
  a pooled connection only for the moment it looks again; counting them in the first
  budget would let a few hundred idle waits starve every heartbeat.

Heartbeats (a path ending ``/heartbeat``) go first: they may use as many requests again
past the limit (``heartbeat_reserve``: the limit, at least 2), so that when other work is
refused a live worker still renews its lease and does not lose its attempt to the
overload. A heartbeat is one short statement; a lost lease costs a whole attempt. With a
quarter of the limit as the reserve, 120 s of ~5x overload at 1,000 agents refused 6,247
heartbeats and one waited 24 s of a 30 s lease; with the whole limit, 1,041 and 12 s
(bench/results/2026-12-04-overload.md).

0 turns a budget off. Health checks (``/healthz``, ``/readyz``, ``/metrics``) are never
refused: a load balancer must see a busy node as alive. Why not uvicorn's own
``--limit-concurrency``: it counts open connections (a thousand idle keep-alive
connections of a thousand agents would trip it) and answers a plain-text 503 without
``Retry-After``.

The other way into a 503 ``overloaded``: a request that waited ``DATABASE_POOL_TIMEOUT``
for a pooled connection and got none (``api.problems.pool_exhausted``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from api.problems import overloaded_body, render_problem

LONG_POLL_PATHS = ("/api/worker/claim",)
LONG_POLL_SUFFIXES = ("/watch",)
LONG_POLL_PREFIX = "/api/worker/attempts/"
NEVER_REFUSED = frozenset({"/healthz", "/readyz", "/metrics"})


def heartbeat_reserve(limit: int) -> int:
    """How many requests past ``limit`` a heartbeat may still be admitted."""
    return max(2, limit)


def is_long_poll(path: str) -> bool:
    return path in LONG_POLL_PATHS or (
        path.startswith(LONG_POLL_PREFIX) and path.endswith(LONG_POLL_SUFFIXES)
    )


class AdmissionMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app
        # One event loop per process serves every request: plain counters, no lock.
        self.serving = 0
        self.polling = 0
        self.refused = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in NEVER_REFUSED:
            await self.app(scope, receive, send)
            return
        long_poll = is_long_poll(scope["path"])
        if long_poll:
            limit = int(settings.HOLDPOINT_WEB_MAX_LONG_POLLS)
            busy = self.polling
        else:
            limit = int(settings.HOLDPOINT_WEB_MAX_INFLIGHT)
            busy = self.serving
            if limit and busy >= limit and scope["path"].endswith("/heartbeat"):
                limit += heartbeat_reserve(limit)
        if limit and busy >= limit:
            self.refused += 1
            await refuse(scope, receive, send, limit=limit, long_poll=long_poll)
            return
        if long_poll:
            self.polling += 1
        else:
            self.serving += 1
        try:
            await self.app(scope, receive, send)
        finally:
            if long_poll:
                self.polling -= 1
            else:
                self.serving -= 1


async def refuse(scope: Any, receive: Any, send: Any, *, limit: int, long_poll: bool) -> None:
    """Read the body and drop it (the connection stays usable for the retry), then answer
    503 ``overloaded`` with ``Retry-After``."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        if message["type"] == "http.request" and not message.get("more_body", False):
            break
    what = "long polls" if long_poll else "requests"
    body = overloaded_body(
        f"The server is serving as many {what} as it can ({limit} in this process); "
        "nothing was done: send the same request again after Retry-After seconds.",
        instance=scope["path"],
        limit=limit,
    )
    payload = render_problem(body)
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(payload)).encode()),
                (b"retry-after", str(body["retry_after"]).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
