"""The sign-in page: Django's LoginView, with the lockout said in words (``runs.ratelimit``).

The lockout itself is enforced by ``LockoutModelBackend`` for every sign-in form; this
page only tells a locked-out person why the right password does not work now and when to
try again, answering 429 with ``Retry-After``.
"""

from __future__ import annotations

import math
from typing import Any

from django import forms
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpResponse
from django.utils.translation import ngettext

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


class LoginView(auth_views.LoginView):
    form_class = LockoutAuthenticationForm
    redirect_authenticated_user = True

    def form_invalid(self, form: Any) -> HttpResponse:
        response = super().form_invalid(form)
        locked_for = getattr(form, "locked_for", None)
        if locked_for is not None:
            response.status_code = 429
            response["Retry-After"] = str(locked_for)
        return response


login = LoginView.as_view()
