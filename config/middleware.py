"""Middleware of the project as a whole (not of one app)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from csp.middleware import CSPMiddleware
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse
from django.middleware.locale import LocaleMiddleware
from django.utils import translation
from django_htmx.middleware import HtmxMiddleware

from api.problems import nul_in_request

API_PREFIX = "/api/"
logger = logging.getLogger("holdpoint.oidc")


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


def api_without_session(request: HttpRequest) -> bool:
    """An API request that carries no session cookie: a token client (person, script or
    worker). It needs no session, no signed-in user from the session, no locale, no
    messages, no CSP header and no htmx details; the page middlewares step aside for it."""
    return request.path_info.startswith(API_PREFIX) and (
        settings.SESSION_COOKIE_NAME not in request.COOKIES
    )


class _PagesOnly:
    """Mixed into one of Django's middlewares: it runs for pages and for API requests with
    a session cookie, and hands a token API request straight on (``api_without_session``).
    A subclass of the original, so that checks asking for it (the admin's) still find it,
    in sync and async mode alike (the handler passed on is of the same mode).

    Measured in docs/performance.md: for a token API request these did work its view
    never uses on every request."""

    get_response: Callable[[HttpRequest], Any]

    def __call__(self, request: HttpRequest) -> Any:
        if api_without_session(request):
            return self.get_response(request)
        return super().__call__(request)  # type: ignore[misc]


class PagesLocaleMiddleware(_PagesOnly, LocaleMiddleware):
    def __call__(self, request: HttpRequest) -> Any:
        if api_without_session(request):
            # The thread may have served a page in another language: the API answers in
            # LANGUAGE_CODE (its machine-readable part is the problem's code).
            translation.deactivate()
        return super().__call__(request)


class PagesSessionMiddleware(_PagesOnly, SessionMiddleware):
    pass


class PagesAuthenticationMiddleware(_PagesOnly, AuthenticationMiddleware):
    pass


class PagesMessageMiddleware(_PagesOnly, MessageMiddleware):
    pass


class PagesCSPMiddleware(_PagesOnly, CSPMiddleware):
    pass


class PagesHtmxMiddleware(_PagesOnly, HtmxMiddleware):
    pass


class OidcSessionRefreshMiddleware:
    """Confirm a session signed in through the company's identity provider with it again
    once ``HOLDPOINT_OIDC_REFRESH_SECONDS`` have passed (docs/security.md, "Company
    sign-in"): the provider then sends fresh claims, and the groups they map to are
    recomputed, so a group removed there is gone here at the latest by then.

    mozilla-django-oidc's ``SessionRefresh`` does this for GET requests only and lets
    everything else through on the old claims. Here nothing goes through on them: a page
    (GET, not htmx) goes to the provider silently (``prompt=none``) and comes back; an htmx
    request is answered 401 with ``HX-Refresh`` (the page reloads, and so goes to the
    provider); any other request (a form's POST, the API under this session) is refused,
    401, and changes nothing. With the provider off, or for a session signed in with a
    password, it does nothing.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not settings.HOLDPOINT_OIDC_ISSUER or api_without_session(request):
            return self.get_response(request)
        from django.urls import reverse

        from runs import oidc

        exempt = {reverse("oidc-callback"), reverse("oidc-authenticate"), reverse("logout")}
        if request.path_info in exempt or not oidc.session_due(request):
            return self.get_response(request)
        return self._confirm(request)

    def _confirm(self, request: HttpRequest) -> HttpResponse:
        from django.contrib.auth import logout
        from django.shortcuts import redirect
        from django.utils.translation import gettext as _

        from runs import oidc

        htmx = request.headers.get("HX-Request") == "true"
        if request.path_info.startswith(API_PREFIX):
            from api.problems import problem_response

            return problem_response(
                "not_authenticated",
                _(
                    "Your sign-in must be confirmed with the identity provider again: reload the dashboard."
                ),
                status=401,
            )
        if request.method in ("GET", "HEAD") and not htmx:
            try:
                return redirect(
                    oidc.authorization_url(request, next_url=request.get_full_path(), silent=True)
                )
            except Exception:
                # The provider cannot be reached (or its discovery document is wrong): sign
                # out rather than go on trusting the old claims.
                logger.exception("OIDC: could not reach the provider to confirm a session")
                logout(request)
                return redirect("login")
        response = HttpResponse(
            _("Your sign-in must be confirmed again. Reload the page; nothing was changed."),
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        if htmx:
            response["HX-Refresh"] = "true"
        return response
