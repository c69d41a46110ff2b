"""Template helpers of the dashboard: times, countdowns, the inbox count, form keys.

Every helper that builds HTML does it with ``format_html``, so the text it is given
(agent-provided, often) is escaped.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from dashboard.actions import new_idempotency_key
from dashboard.present import absolute, ago_text, clock, expires_text, isolate, span
from runs.selectors import inbox_for_user

register = template.Library()


@register.simple_tag(takes_context=True)
def inbox_count(context: template.Context) -> int:
    """How many requests wait for this user: the same query as the inbox list
    (docs/dashboard.md); ``inbox_n`` when the render was given the count (a live push
    counts once for everyone with the same permissions)."""
    given = context.get("inbox_n")
    if given is not None:
        return int(given)
    request = context.get("request")
    if request is None or not request.user.is_authenticated:
        return 0
    cached = getattr(request, "_holdpoint_inbox_count", None)
    if cached is None:
        cached = inbox_for_user(user=request.user).count()
        request._holdpoint_inbox_count = cached
    return cached


@register.simple_tag(takes_context=True)
def browser_notifications(context: template.Context) -> str:
    """``on`` or ``off``: whether this person wants browser notifications (their profile)."""
    request = context.get("request")
    if request is None or not request.user.is_authenticated:
        return "off"
    from runs.models import NotificationPreference

    off = NotificationPreference.objects.filter(user=request.user, browser=False).exists()
    return "off" if off else "on"


@register.filter
def bdi(value: Any) -> SafeString:
    """``{{ req.target|bdi }}``: agent text escaped inside ``<bdi>`` (``isolate``), so a
    right-to-left override in it cannot reorder the text around it. For element content
    only, never inside an attribute."""
    return isolate(value)


@register.simple_tag
def new_key() -> str:
    """A fresh idempotency key for an action form, made when the form is rendered."""
    return new_idempotency_key()


@register.simple_tag
def ago(value: dt.datetime | None) -> SafeString:
    """``5m 02s ago`` with the absolute time (the user's zone) on hover (docs/dashboard.md)."""
    if value is None:
        return format_html("{}", "—")
    return format_html(
        '<time datetime="{}" title="{}" data-ago>{}</time>',
        value.isoformat(),
        absolute(value),
        ago_text(value),
    )


@register.simple_tag
def at(value: dt.datetime | None) -> SafeString:
    """``14:02`` (or ``Nov 28, 14:02``) with the full time on hover."""
    if value is None:
        return format_html("{}", "—")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', value.isoformat(), absolute(value), clock(value)
    )


@register.simple_tag
def countdown(value: dt.datetime, short: bool = False) -> SafeString:
    """A live "Expires in 2h 14m" (app.js ticks it) with the absolute time beside it;
    ``short``: the time left alone ("2h 14m left"), the absolute time on hover."""
    now = timezone.now()
    if short:
        return format_html(
            '<span class="countdown countdown-short{}" title="{}"><time datetime="{}" '
            'data-countdown data-fmt-left="{}" data-fmt-gone="{}">{}</time></span>',
            " is-expired" if value <= now else "",
            clock(value, zone=True),
            value.isoformat(),
            _("{} left"),
            _("Expired"),
            _("%(span)s left") % {"span": span((value - now).total_seconds())}
            if value > now
            else _("Expired"),
        )
    return format_html(
        '<span class="countdown{}"><time datetime="{}" data-countdown '
        'data-fmt-left="{}" data-fmt-gone="{}">{}</time> '
        '<span class="countdown-at">({})</span></span>',
        " is-expired" if value <= now else "",
        value.isoformat(),
        _("Expires in {}"),
        _("Expired"),
        expires_text(value, now),
        clock(value, zone=True),
    )


@register.simple_tag
def field_attrs(field: Any) -> SafeString:
    """The HTML attributes a schema field asks for (min, max, step, pattern, maxlength…)."""
    return format_html_join(" ", '{}="{}"', sorted(field.attrs.items()))
