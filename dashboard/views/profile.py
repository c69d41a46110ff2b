"""A person's profile page: the channels they are told on (issue 18)."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from dashboard.actions import HtmxHttpRequest, dashboard_view, redirect_after_post
from runs.ratelimit import hit, rate_for
from runs.services.notifications import notification_preferences, notification_preferences_set


class NotificationForm(forms.Form):
    email = forms.BooleanField(
        required=False,
        label=gettext_lazy("E-mail me when a question or approval waits for me"),
    )
    browser = forms.BooleanField(
        required=False,
        label=gettext_lazy(
            "Show a browser notification and a count in the tab title while a dashboard "
            "tab is open in the background"
        ),
    )


@dashboard_view(require_view=False)
def profile(request: HtmxHttpRequest) -> HttpResponse:
    """GET shows the person's channels; POST saves them (setting them twice is harmless)."""
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    current = notification_preferences(request.user)
    if request.method == "POST":
        rate = rate_for("HOLDPOINT_THROTTLE_USER")
        if rate is not None and not hit("profile", f"user:{request.user.pk}", rate).allowed:
            return HttpResponse(
                _("Too many changes at once; try again in a minute."),
                status=429,
                content_type="text/plain; charset=utf-8",
            )
        form = NotificationForm(request.POST)
        if form.is_valid():
            notification_preferences_set(
                user=request.user,
                email=form.cleaned_data["email"],
                browser=form.cleaned_data["browser"],
            )
            messages.success(request, _("Saved. You are told on the channels you chose."))
            return redirect_after_post("/profile/")
    else:
        form = NotificationForm(initial={"email": current.email, "browser": current.browser})
    return render(
        request,
        "dashboard/profile.html",
        {"form": form, "has_email": bool(getattr(request.user, "email", ""))},
        status=200 if form.is_bound is False or form.is_valid() else 422,
    )
