"""The sign-in page: Django's LoginView, with the lockout said in words (``runs.ratelimit``).

The lockout itself is enforced by ``LockoutModelBackend`` for every sign-in form; this
page only tells a locked-out person why the right password does not work now and when to
try again, answering 429 with ``Retry-After``.

With the company's identity provider configured (``runs.oidc``) the page offers "Sign in
with <name>"; with ``HOLDPOINT_PASSWORD_LOGIN`` off it offers nothing else, and a password
POST here or to the admin's sign-in is refused (403) without being checked.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from runs import oidc
from runs.ratelimit import client_address, login_lockout_remaining

LOCKED_OUT = "locked_out"


def lockout_message(seconds: int) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return ngettext(
        "Too many failed sign-ins. Try again in %(minutes)d minute.",
        "Too many failed sign-ins. Try again in %(minutes)d minutes.",
        minutes,
    ) % {"minutes": minutes}


class LockoutAuthenticationForm(AuthenticationForm):
    """Django's sign-in form that names a lockout instead of "wrong password"."""

    locked_for: int | None = None

    def clean(self) -> dict[str, Any]:
        username = self.cleaned_data.get("username")
        address = client_address(self.request)
        self.locked_for = login_lockout_remaining(username=username, address=address)
        if self.locked_for is None:
            try:
                return super().clean()
            except forms.ValidationError:
                # This very failure may have started the lockout: say so now, not next time.
                self.locked_for = login_lockout_remaining(username=username, address=address)
                if self.locked_for is None:
                    raise
        raise forms.ValidationError(lockout_message(self.locked_for), code=LOCKED_OUT)


def password_off_message() -> str:
    return _("Password sign-in is turned off here. Sign in with %(name)s.") % {
        "name": oidc.provider_name()
    }


def sign_in_options(next_url: str | None) -> dict[str, Any]:
    """What the sign-in page offers: the password form, the identity provider, or both."""
    options: dict[str, Any] = {
        "password_login": oidc.password_login_enabled(),
        "oidc_name": None,
        "oidc_url": None,
    }
    if oidc.enabled():
        query = f"?{urlencode({'next': next_url})}" if next_url else ""
        options["oidc_name"] = oidc.provider_name()
        options["oidc_url"] = reverse("oidc-authenticate") + query
    return options


def render_login(
    request: HttpRequest, *, status: int, error: str, next_url: str = "", **headers: str
) -> HttpResponse:
    """The sign-in page with ``error`` said on it (a refused sign-in of any kind)."""
    context = {
        "form": LockoutAuthenticationForm(request) if oidc.password_login_enabled() else None,
        "next": next_url,
        "sign_in_error": error,
        **sign_in_options(next_url),
    }
    response = render(request, "registration/login.html", context, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


class LoginView(auth_views.LoginView):
    form_class = LockoutAuthenticationForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context.update(sign_in_options(context.get("next")))
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not oidc.password_login_enabled():
            # Refused before any password is looked at (no backend would take it either).
            return render_login(request, status=403, error=password_off_message())
        return super().post(request, *args, **kwargs)

    def form_invalid(self, form: Any) -> HttpResponse:
        response = super().form_invalid(form)
        locked_for = getattr(form, "locked_for", None)
        if locked_for is not None:
            response.status_code = 429
            response["Retry-After"] = str(locked_for)
        return response


login = LoginView.as_view()


def admin_login(request: HttpRequest) -> HttpResponse:
    """The admin's sign-in: Django's, unless passwords are off; then a GET goes to our
    sign-in page (the identity provider) and a POST is refused, so the admin's form is no
    way around ``HOLDPOINT_PASSWORD_LOGIN=0``."""
    if oidc.password_login_enabled():
        return admin.site.login(request)
    if request.method == "POST":
        return render_login(request, status=403, error=password_off_message())
    return redirect_to_login(request.GET.get("next") or reverse("admin:index"))
