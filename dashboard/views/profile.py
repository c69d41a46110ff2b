"""A person's profile page: the channels they are told on (issue 18), and their Slack
account (issue 28: linked from the link Slack shows them, unlinked here)."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from dashboard.actions import HtmxHttpRequest, dashboard_view, redirect_after_post, throttled
from runs.errors import HoldpointError
from runs.models import SlackIdentity
from runs.services.notifications import notification_preferences, notification_preferences_set
from runs.services.slack import read_link_token, slack_link, slack_unlink


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
        refused = throttled(request, "profile")
        if refused is not None:
            return refused
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
        {
            "form": form,
            "has_email": bool(getattr(request.user, "email", "")),
            "slack_on": bool(settings.HOLDPOINT_SLACK_CHANNELS),
            "slack": SlackIdentity.objects.filter(user_id=request.user.pk or 0).first(),
        },
        status=200 if form.is_bound is False or form.is_valid() else 422,
    )


@dashboard_view(require_view=False)
def slack_link_confirm(request: HtmxHttpRequest, token: str) -> HttpResponse:
    """The link Slack shows an unlinked clicker (``api/slack.py``): GET asks the signed-in
    person to confirm that the Slack account is theirs; POST links it."""
    if request.method not in ("GET", "HEAD", "POST"):
        return HttpResponse(status=405, headers={"Allow": "GET, POST"})
    refused = throttled(request, "profile")
    if refused is not None:
        return refused
    account = read_link_token(token)
    if account is None:
        return render(request, "dashboard/slack_link.html", {"invalid": True}, status=404)
    if request.method == "POST":
        try:
            slack_link(user=request.user, account=account, how="profile")
        except HoldpointError as exc:
            messages.error(request, exc.detail)
        else:
            messages.success(
                request,
                _("Linked. Your clicks in Slack now decide as you, %(who)s.")
                % {"who": request.user.get_username()},
            )
        return redirect_after_post("/profile/")
    return render(request, "dashboard/slack_link.html", {"account": account, "token": token})


@dashboard_view(require_view=False)
@require_POST
def slack_unlink_view(request: HtmxHttpRequest) -> HttpResponse:
    refused = throttled(request, "profile")
    if refused is not None:
        return refused
    if slack_unlink(user=request.user):
        messages.success(request, _("Unlinked. Clicks from that Slack account decide nothing now."))
    return redirect_after_post("/profile/")
