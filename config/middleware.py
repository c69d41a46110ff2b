"""Middleware of the project as a whole (not of one app)."""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse

from api.problems import nul_in_request

API_PREFIX = "/api/"


class NulCharacter(SuspiciousOperation):
    """A NUL character in the path, the query or a form field (logged to django.security)."""


class NulCharacterMiddleware:
    """Answer 400 to a page request carrying a NUL character, before any view reads it.

    The API answers its own problem for the same refusal (``api.problems``)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith(API_PREFIX):
            where = nul_in_request(request, form=True)
            if where is not None:
                raise NulCharacter(
                    f"A NUL character in the {where} of {request.method} {request.path!r}."
                )
        return self.get_response(request)


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
