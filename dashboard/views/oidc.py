"""Sign-in through the company's identity provider: the way there and the way back
(``runs.oidc``; docs/security.md, "Company sign-in").

``oidc_authenticate`` starts a sign-in (GET ``/oidc/authenticate/``: a fresh state, nonce
and PKCE verifier in the session, then the provider). ``oidc_callback`` is where the
provider sends the person back (GET ``/oidc/callback/``): mozilla-django-oidc checks the
state against the session and hands the code to ``runs.oidc.OidcBackend``, which checks
the ID token and signs the person in. Both answer 404 while no provider is configured and
are counted per client address (``HOLDPOINT_THROTTLE_ANON``); a failed callback counts
against the address like a failed token (``HOLDPOINT_THROTTLE_AUTH_FAILURES``). A refusal
is the sign-in page saying why, and changes nothing: nobody is signed in, and a session
that was signed in is signed out (a callback that fails may be a confirmation that
failed).
"""

from __future__ import annotations

import logging
from typing import Any

import requests
from django.contrib.auth import logout
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.translation import gettext as _
from django.views.decorators.cache import never_cache
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, get_next_url

from dashboard.views.login import render_login
from runs import oidc
from runs.ratelimit import (
    auth_failure_record,
    auth_failures_blocked,
    client_address,
    hit,
    rate_for,
)

logger = logging.getLogger("holdpoint.oidc")


def _throttled(request: HttpRequest) -> HttpResponse | None:
    rate = rate_for("HOLDPOINT_THROTTLE_ANON")
    if rate is None:
        return None
    verdict = hit("oidc", client_address(request), rate)
    if verdict.allowed:
        return None
    return render_login(
        request,
        status=429,
        error=_("Too many sign-ins from your address. Try again in a minute."),
        **{"Retry-After": str(verdict.retry_after)},
    )


@never_cache
def oidc_authenticate(request: HttpRequest) -> HttpResponse:
    if not oidc.enabled():
        raise Http404
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET"})
    refused = _throttled(request)
    if refused is not None:
        return refused
    next_url = get_next_url(request, "next")
    try:
        return HttpResponseRedirect(oidc.authorization_url(request, next_url=next_url))
    except (requests.RequestException, SuspiciousOperation, ValueError) as exc:
        logger.warning("OIDC: the provider's discovery document could not be read: %s", exc)
        return render_login(
            request,
            status=502,
            error=_("%(name)s cannot be reached just now. Try again in a minute.")
            % {"name": oidc.provider_name()},
        )


class OidcCallbackView(OIDCAuthenticationCallbackView):
    """mozilla-django-oidc's callback (state from the session, used once), with Holdpoint's
    throttle and its refusals said on the sign-in page."""

    http_method_names = ["get", "head"]

    @staticmethod
    def get_settings(attr: str, *args: Any) -> Any:
        return oidc.oidc_setting(attr, *args)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not oidc.enabled():
            raise Http404
        refused = _throttled(request)
        if refused is not None:
            return refused
        blocked = auth_failures_blocked(client_address(request))
        if blocked is not None:
            return render_login(
                request,
                status=429,
                error=_("Too many failed sign-ins from your address. Try again in a minute."),
                **{"Retry-After": str(blocked)},
            )
        try:
            return super().get(request)
        except SuspiciousOperation as exc:
            logger.warning("OIDC: callback refused: %s", exc)
            return self._refuse(
                400,
                _(
                    "This answer from %(name)s was refused: it does not belong to a sign-in "
                    "started in this browser, was used before, or does not check out. "
                    "Start again."
                )
                % {"name": oidc.provider_name()},
            )
        except requests.RequestException as exc:
            logger.warning("OIDC: the provider could not be reached: %s", exc)
            return self._refuse(
                502,
                _("%(name)s could not be reached or refused the sign-in. Try again.")
                % {"name": oidc.provider_name()},
            )

    def login_failure(self) -> HttpResponse:
        reason = getattr(self.request, "holdpoint_oidc_refusal", None)
        if reason is None and self.request.GET.get("error"):
            reason = _("%(name)s did not sign you in. Sign in again.") % {
                "name": oidc.provider_name()
            }
        return self._refuse(
            403,
            reason
            or _("Sign-in with %(name)s failed. Start again.") % {"name": oidc.provider_name()},
        )

    def _refuse(self, status: int, message: str) -> HttpResponse:
        request = self.request
        if not request.GET.get("error"):
            # The provider's own "no" (login_required when a session is confirmed) is an
            # answer, not a guess; anything else counts against the address.
            auth_failure_record(client_address(request))
        if request.user.is_authenticated:
            logout(request)
        return render_login(request, status=status, error=message)


oidc_callback = never_cache(OidcCallbackView.as_view())
