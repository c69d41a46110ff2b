"""Django's ASGI handler, serving each request in one thread of a reused pool.

Every view and middleware here is sync. Django's ``ASGIHandler`` runs them through
``sync_to_async(thread_sensitive=True)`` inside a ``ThreadSensitiveContext`` per request,
which starts (and afterwards stops) a new thread for every request, and crosses between
that thread and the event loop several times: ``request_started``, the middleware chain,
back to the loop for the async base handler, again for the view, and ``request_finished``.
Measured with py-spy under uvicorn and daphne, that cost an ASGI server about twice a
WSGI server's CPU for the same ``GET /api/runs/{id}`` (docs/performance.md).

``PooledASGIHandler`` keeps what a WSGI server does: the sync middleware chain
(``load_middleware(is_async=False)``), run with both request signals in one call in one
thread, taken from a pool whose threads (and their database connections) are reused.
The body is read and the response sent on the event loop, as before, and a client's
hang-up is still heard while the view runs (``api.hangup``). The thread cannot be
stopped once it runs; a response to a client that has gone is dropped.

``async_to_sync`` inside a view (``config.health``) still runs on the server's event loop:
the pool is entered through asgiref's ``sync_to_async``, which remembers that loop.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import HttpResponseBase
from django.urls import set_script_prefix

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    """The process's pool. Threads start as requests need them, up to
    ``HOLDPOINT_WEB_THREADS`` (long polls each hold one while they wait), and are kept."""
    global _executor
    if _executor is None:
        with _executor_lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(
                    max_workers=settings.HOLDPOINT_WEB_THREADS, thread_name_prefix="web"
                )
    return _executor


class PooledASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        base.BaseHandler.__init__(self)
        self.load_middleware(is_async=False)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        await self.handle(scope, receive, send)

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        pool = executor()
        work = asyncio.ensure_future(
            sync_to_async(self.serve, thread_sensitive=False, executor=pool)(scope, body_file)
        )
        listen = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait([work, listen], return_when=asyncio.FIRST_COMPLETED)
            hung_up = listen.done()
            if hung_up and not isinstance(listen.exception(), RequestAborted):
                listen.result()  # an unexpected ASGI message: raise, as Django does
            # After a hang-up the view's thread goes on to its end; its answer is dropped.
            response = await work
            if not hung_up:
                await self.send_response(response, send)
            if response.streaming:
                await sync_to_async(self.finish, thread_sensitive=False, executor=pool)(response)
        finally:
            listen.cancel()
            body_file.close()

    def serve(self, scope: Any, body_file: Any) -> HttpResponseBase:
        """One request, start to finish, in one pool thread (what a WSGI server does)."""
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            response: HttpResponseBase = error_response  # type: ignore[assignment]
        else:
            response = self.get_response(request)
            response._handler_class = self.__class__  # type: ignore[attr-defined]
        if not response.streaming:
            # The body is already in memory: close now, in the thread that served the
            # request, so that request_finished gives back this thread's connection.
            self.finish(response)
        return response

    @staticmethod
    def finish(response: HttpResponseBase) -> None:
        response.close()
