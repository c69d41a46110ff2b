"""Middleware of the project as a whole (not of one app)."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse


class SyncChainMiddleware:
    """Last in ``MIDDLEWARE``: under ASGI, run the middleware chain in one thread.

    Django runs an async-capable middleware in async mode when the handler inside it is
    async, and ``MiddlewareMixin`` (sessions, CSRF, auth, messages, locale, ...) then
    calls each ``process_request`` / ``process_response`` through ``sync_to_async``: a
    thread hop per middleware and phase, on every request. A sync-only innermost
    middleware makes every middleware outside it run in sync mode, so a request crosses
    to the worker thread once (and back for the async base handler) instead. The views
    are sync; nothing is lost. Measured in docs/performance.md.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)
