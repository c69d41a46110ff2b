"""What every dashboard view shares: login and permission gates, the user's time zone,
safe redirects, and the idempotent execution of an action form.

An action form carries a key generated when it was rendered (``idempotency_key``).
The view validates the form first (pure: the same body always gives the same
errors), then runs the one service call through ``perform_once``: a second POST
with the same key and body gets the recorded outcome back instead of acting again.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import functools
import json
import secrets
import time
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast
from urllib.parse import unquote

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from runs.errors import HoldpointError
from runs.idempotency import (
    StoredResponse,
    idempotent_call,
    parse_idempotency_key,
    principal_for_user,
)
from runs.ratelimit import hit, rate_for
from runs.selectors import VIEW

TZ_COOKIE = "tz"
KEY_FIELD = "idempotency_key"


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


View = TypeVar("View", bound=Callable[..., HttpResponse])


def user_timezone(request: HttpRequest) -> zoneinfo.ZoneInfo | None:
    """The browser's zone, which app.js stores in the ``tz`` cookie (None: the server's)."""
    name = unquote(request.COOKIES.get(TZ_COOKIE, ""))
    if not name or len(name) > 64:
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


def activate_user_timezone(request: HttpRequest) -> None:
    """Show times in the browser's zone (pages; live pushes use ``user_timezone``)."""
    zone = user_timezone(request)
    if zone is None:
        timezone.deactivate()
    else:
        timezone.activate(zone)


def dashboard_view(*, require_view: bool = True) -> Callable[[View], View]:
    """Login required; ``require_view`` also needs ``runs.view_run`` (a 403 page without it).

    Views about one run leave ``require_view`` off: their selector answers 404 to an
    outsider, so the existence of a run never leaks.
    """

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            activate_user_timezone(request)
            if require_view and not request.user.has_perm(VIEW):
                raise PermissionDenied(_("You have no access to runs yet."))
            return view(request, *args, **kwargs)

        signed_in = login_required(wrapper)

        @functools.wraps(view)
        def gate(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            htmx = getattr(request, "htmx", None)
            if htmx and not request.user.is_authenticated:
                # A session that ran out: htmx would follow the redirect and swap the login
                # page into a card. Send the whole page to the login page instead.
                back = htmx.current_url_abs_path or "/"
                return HttpResponseClientRedirect(redirect_to_login(back).url)
            return signed_in(request, *args, **kwargs)

        return cast(View, gate)

    return decorate


def throttled(request: HttpRequest, scope: str) -> HttpResponse | None:
    """429 with ``Retry-After`` when this person is past ``HOLDPOINT_THROTTLE_USER`` in
    ``scope`` (the pages' actions that are not the API: the profile, an e-mail's link),
    else None."""
    rate = rate_for("HOLDPOINT_THROTTLE_USER")
    if rate is None:
        return None
    verdict = hit(scope, f"user:{request.user.pk}", rate)
    if verdict.allowed:
        return None
    return HttpResponse(
        _("Too many requests at once; try again in a minute."),
        status=429,
        content_type="text/plain; charset=utf-8",
        headers={"Retry-After": str(verdict.retry_after)},
    )


def new_idempotency_key() -> str:
    return f"form-{secrets.token_urlsafe(18)}"


def form_key(request: HttpRequest) -> str | None:
    """The form's idempotency key, or None when it is missing or malformed.

    The same rules as the ``Idempotency-Key`` header of the API (one key, 1-255
    printable ASCII characters).
    """
    values = request.POST.getlist(KEY_FIELD)
    if len(values) != 1:
        return None
    try:
        return parse_idempotency_key(values)
    except HoldpointError:
        return None


def safe_next(request: HttpRequest, fallback: str) -> str:
    """Where a POST without JavaScript goes back to: the form's ``next``, if it is ours."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return fallback


def redirect_after_post(url: str) -> HttpResponseRedirect:
    """303: the browser follows with a GET, so reloading the page never re-sends the form."""
    response = HttpResponseRedirect(url)
    response.status_code = 303
    return response


@dataclass
class Outcome:
    """What an action did, in a form that can be stored and replayed (JSON only)."""

    ok: bool
    code: str = ""
    detail: str = ""
    status: int = 200
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "code": self.code,
            "detail": self.detail,
            "status": self.status,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(
            ok=bool(data.get("ok")),
            code=str(data.get("code", "")),
            detail=str(data.get("detail", "")),
            status=int(data.get("status", 200)),
            extra=dict(data.get("extra") or {}),
        )

    @classmethod
    def from_error(cls, error: HoldpointError) -> Outcome:
        extra = {k: v for k, v in error.extra.items() if isinstance(v, str | int | float | bool)}
        if isinstance(error.extra.get("errors"), list):
            extra["errors"] = error.extra["errors"]
        return cls(ok=False, code=error.code, detail=error.detail, status=error.status, extra=extra)


def run_service(call: Callable[[], dict[str, Any] | None]) -> Outcome:
    """Run one service call; a refusal becomes an ``Outcome`` instead of an exception."""
    try:
        extra = call() or {}
    except HoldpointError as error:
        return Outcome.from_error(error)
    return Outcome(ok=True, extra=extra)


# How long a repeat waits for the first request with its key to finish (a double click
# without JavaScript sends the second POST while the first is still being processed).
IN_PROGRESS_WAITS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0)


def perform_once(
    request: HttpRequest,
    *,
    key: str,
    body: dict[str, Any],
    call: Callable[[], dict[str, Any] | None],
) -> tuple[Outcome, bool]:
    """Run ``call`` once per (user, key) through ``runs.idempotency``; return (outcome, replayed).

    A repeat with the same key and body gets the outcome of the first, refusals
    included; the same key with a different body is refused (``idempotency_key_reused``).
    A repeat that arrives while the first is still running waits a moment for its
    outcome rather than answering "in progress".
    """

    def execute() -> StoredResponse:
        outcome = run_service(call)
        return StoredResponse(
            status=outcome.status,
            body=json.dumps(outcome.as_json()).encode(),
            content_type="application/json",
        )

    waits = list(IN_PROGRESS_WAITS)
    while True:
        try:
            stored, replayed = idempotent_call(
                principal=principal_for_user(request.user),
                key=key,
                method=request.method or "POST",
                path=request.path,
                body=body,
                execute=execute,
            )
        except HoldpointError as error:
            if error.code == "idempotency_in_progress" and waits:
                time.sleep(waits.pop(0))
                continue
            return Outcome.from_error(error), False
        return Outcome.from_json(json.loads(stored.body)), replayed


@dataclass
class Submitted:
    """What an action form's POST did: its outcome (new or replayed) and the values it was
    performed with (the ids it was rendered for, the cleaned form, the other values)."""

    outcome: Outcome
    data: dict[str, Any]


def submit_action(
    request: HttpRequest,
    *,
    ids: dict[str, str],
    perform: Callable[[dict[str, Any]], dict[str, Any] | None],
    stale: Callable[[], HttpResponse],
    form: forms.Form | None = None,
    invalid: Callable[[Any], HttpResponse] | None = None,
    values: dict[str, Any] | None = None,
) -> HttpResponse | Submitted:
    """The steps of every action form, in this order, each ending the POST with nothing
    done when it fails: the form's idempotency key and the ids it was rendered for
    (``ids``, e.g. ``{"run_id": run.id}``; a missing key or another object's form is
    ``stale()``), then the form (``invalid(form)``), then ``perform(data)`` once per key
    (``perform_once``) with ``data`` the ids, the cleaned form and ``values``. The view
    says what happened (its message) from the ``Submitted`` outcome."""
    key = form_key(request)
    if key is None or any(request.POST.get(name) != value for name, value in ids.items()):
        return stale()
    data: dict[str, Any] = {**ids, **(values or {})}
    if form is not None:
        if not form.is_valid():
            if invalid is None:  # pragma: no cover - every view with a form says how
                raise ValueError("submit_action with a form needs invalid=")
            return invalid(form)
        data.update(form.cleaned_data)
    outcome, _replayed = perform_once(request, key=key, body=data, call=lambda: perform(data))
    return Submitted(outcome, data)


def add_message(request: HttpRequest, outcome: Outcome, success: str, failure: str) -> None:
    if outcome.ok:
        messages.success(request, success)
    else:
        messages.error(request, failure)


def encode_cursor(when: dt.datetime, pk: str) -> str:
    """A list's cursor: the sort key of the last row shown, which the next page starts after."""
    raw = f"{when.isoformat()}|{pk}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(value: str) -> tuple[dt.datetime, str] | None:
    """The (time, id) a page starts after, or None for a missing or garbled cursor."""
    if not value or len(value) > 200:
        return None
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    when_text, _sep, pk = raw.partition("|")
    try:
        when = parse_datetime(when_text)
    except ValueError:
        return None
    if when is None or not pk:
        return None
    return when, pk
