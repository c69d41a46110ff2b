"""The inbox, and answering a request (input or approval) from the inbox or the run page."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext
from django.views.decorators.http import require_GET, require_POST

from dashboard.actions import (
    HtmxHttpRequest,
    Outcome,
    dashboard_view,
    decode_cursor,
    encode_cursor,
    form_key,
    perform_once,
    redirect_after_post,
    safe_next,
)
from dashboard.present import describe_action, request_outcome_text
from dashboard.views.cards import RequestCard, build_card, who_can_text
from dashboard.views.runs import render_run_main, render_run_page
from runs import services
from runs.access import Actor
from runs.approvals import approvals_needed
from runs.models import InputRequest
from runs.selectors import (
    VIEW,
    inbox_for_user,
    permission_for_request_kind,
    request_get_for_user,
)
from runs.states import RequestKind, RequestStatus

TABS = [
    ("needs", gettext_lazy("Needs me")),
    ("all", gettext_lazy("All pending")),
    ("answered", gettext_lazy("Answered")),
    ("expired", gettext_lazy("Expired")),
]
# Cards per page. Each card is a form, and rendering them was most of the page's time
# (bench/growth.py: ~100-250 ms for 100 cards); the rest come with "Show more".
PAGE = 25


def _tab_requests(
    user: Actor, tab: str, cursor: tuple[dt.datetime, str] | None = None
) -> QuerySet[InputRequest]:
    """The tab's requests in its order, after ``cursor`` (the sort key of a card shown last)."""
    if tab in ("needs", "all"):
        requests = inbox_for_user(user=user, mine_only=tab == "needs")
        if cursor is not None:
            # The range on expires_at alone lets the scan of request_pending_expiry_idx start
            # at the cursor and stay in order; the OR only breaks ties.
            when, after_id = cursor
            requests = requests.filter(expires_at__gte=when).filter(
                Q(expires_at__gt=when) | Q(id__gt=after_id)
            )
        return requests
    if not user.has_perm(VIEW):
        return InputRequest.objects.none()
    closed = InputRequest.objects.select_related("run", "answered_by")
    if tab == "answered":
        closed = closed.filter(status=RequestStatus.ANSWERED).order_by("-answered_at", "-id")
        if cursor is not None:
            when, after_id = cursor
            closed = closed.filter(answered_at__lte=when).filter(
                Q(answered_at__lt=when) | Q(id__lt=after_id)
            )
        return closed
    closed = closed.filter(status__in=[RequestStatus.EXPIRED, RequestStatus.CANCELLED]).order_by(
        "-closed_at", "-id"
    )
    if cursor is not None:
        when, after_id = cursor
        closed = closed.filter(closed_at__lte=when).filter(
            Q(closed_at__lt=when) | Q(id__lt=after_id)
        )
    return closed


def _sort_key(req: InputRequest, tab: str) -> dt.datetime | None:
    """What ``tab`` orders by (and so what its cursor holds)."""
    if tab == "answered":
        return req.answered_at
    if tab == "expired":
        return req.closed_at
    return req.expires_at


def inbox_requests(
    user: Actor,
    tab: str,
    *,
    keep: Iterable[str] = (),
    cursor: tuple[dt.datetime, str] | None = None,
) -> list[InputRequest]:
    """The requests the inbox lists on ``tab``, in its order: a page of them.

    ``keep``: requests a live page already shows that have left the list since (expired,
    closed, or answered by this user); they stay in their place, read-only, so a person
    sees what became of them (``live.consumers``).
    """
    requests = list(_tab_requests(user, tab, cursor)[:PAGE])
    listed = {r.id for r in requests}
    extra = [k for k in keep if k not in listed]
    if extra:
        requests += InputRequest.objects.select_related("run", "answered_by").filter(pk__in=extra)
        requests.sort(key=lambda r: (r.expires_at, r.id))
    return requests


def _last_listed(tab: str, requests: list[InputRequest]) -> InputRequest | None:
    """The last request of a full page (its cursor opens the next), or None when the page
    is not full. On the pending tabs the kept requests (closed by now) do not count.

    A full page always offers "Show more", even when nothing follows (which the next page
    then says): the live socket re-renders the list only when the page's own requests
    change, so a page that knew of one more would miss the one that arrives past it.
    """
    if tab in ("needs", "all"):
        listed = [r for r in requests if r.status == RequestStatus.PENDING]
    else:
        listed = requests
    return listed[-1] if len(listed) >= PAGE else None


@dataclass
class InboxGroup:
    """Pending questions of one agent that read the same (kind and title): one line."""

    key: tuple[str, ...]
    cards: list[RequestCard]

    @property
    def title(self) -> str:
        return self.cards[0].title

    @property
    def agent(self) -> str:
        return str(self.cards[0].run.agent)

    @property
    def soonest(self) -> dt.datetime:
        return min(c.req.expires_at for c in self.cards)

    @property
    def expanded(self) -> bool:
        return any(c.expanded for c in self.cards)


def group_cards(cards: list[RequestCard]) -> list[InboxGroup]:
    """Identical pending questions of one agent together, at the place of the most urgent
    (the list is in urgency order already); everything else stays a row of its own."""
    groups: list[InboxGroup] = []
    by_key: dict[tuple[str, ...], InboxGroup] = {}
    for card in cards:
        if card.is_open and not card.broken:
            key: tuple[str, ...] = (str(card.run.agent), str(card.req.kind), card.title)
        else:
            key = ("one", card.req.id)
        if key in by_key:
            by_key[key].cards.append(card)
        else:
            by_key[key] = InboxGroup(key=key, cards=[card])
            groups.append(by_key[key])
    return groups


def inbox_context(
    user: Actor,
    tab: str,
    *,
    replace: RequestCard | None = None,
    requests: list[InputRequest] | None = None,
    cursor: tuple[dt.datetime, str] | None = None,
) -> dict[str, Any]:
    """The inbox page's context (the page and its live socket share it).

    ``replace`` puts a card already built (a form with its errors) in its request's place.
    ``cursor``: the page after the card with that sort key (a live socket shows the first).
    """
    if requests is None:
        requests = inbox_requests(user, tab, cursor=cursor)
    cards = []
    for req in requests:
        if replace is not None and req.id == replace.req.id:
            cards.append(replace)
        else:
            cards.append(build_card(req, user=user, origin="inbox"))
    if replace is not None and all(c.req.id != replace.req.id for c in cards):
        cards.insert(0, replace)
    if replace is not None:
        replace.expanded = True
    elif cursor is None and tab in ("needs", "all"):
        # The most urgent question the person can answer opens at once (docs/dashboard.md).
        first = next((c for c in cards if c.is_open and c.can_answer), None)
        if first is not None:
            first.expanded = True
    token = inbox_token((card.req.id, card.version) for card in cards)
    next_url = ""
    last = _last_listed(tab, requests)
    when = _sort_key(last, tab) if last is not None else None
    if last is not None and when is not None:
        next_url = "?" + urlencode({"tab": tab, "cursor": encode_cursor(when, last.id)})
    return {
        "tab": tab,
        "tabs": TABS,
        "cards": cards,
        "groups": group_cards(cards),
        "live_token": token,
        "next_url": next_url,
        "first_url": "?" + urlencode({"tab": tab}) if cursor is not None else "",
    }


def inbox_token(versions: Iterable[tuple[str, str]]) -> str:
    """Names what a rendered inbox list shows (its cards' ids and versions, in order); its
    live socket sends nothing the page already has."""
    shown = "|".join(f"{req_id}:{version}" for req_id, version in versions)
    return hashlib.sha256(shown.encode()).hexdigest()[:16]


def _inbox_page(
    request: HtmxHttpRequest, *, replace: RequestCard | None = None, status: int = 200
) -> HttpResponse:
    tab = request.GET.get("tab", "needs")
    if replace is not None or tab not in dict(TABS):
        tab = "needs"
    cursor = decode_cursor(request.GET.get("cursor", "")) if replace is None else None
    context = inbox_context(request.user, tab, replace=replace, cursor=cursor)
    if request.htmx and not request.htmx.boosted:
        if request.htmx.target == "inbox-more" and cursor is not None:
            # "Show more": the next cards and a new control, in place of the old control.
            return render(request, "dashboard/inbox.html#inbox-more-page", context, status=status)
        if request.htmx.target == "inbox-list":
            return render(request, "dashboard/inbox.html#inbox-list", context, status=status)
    return render(request, "dashboard/inbox.html", context, status=status)


@dashboard_view()
@require_GET
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    """Every pending request the user may answer, soonest expiry first, a page at a time."""
    return _inbox_page(request)


@dashboard_view()
@require_GET
def inbox_count(request: HtmxHttpRequest) -> HttpResponse:
    """The nav badge alone, from the same query as the list (docs/dashboard.md)."""
    return render(request, "base.html#inbox-count", {})


def _success_text(req: InputRequest, value: Any) -> str:
    team = _team_success_text(req, value)
    if team:
        return team
    if req.kind == RequestKind.AUTH_REQUIRED:
        name = describe_action(req.action).name
        if isinstance(value, dict) and value.get("decision") == "approve":
            return _("Approved. The run goes on and runs %(name)s.") % {"name": name}
        return _("Denied. The run is told not to run %(name)s.") % {"name": name}
    return _("Answer sent. The run resumes in a new attempt.")


def _team_success_text(req: InputRequest, value: Any) -> str:
    """After a decision on an approval for a team (issue 18): one of several approvals, an
    approval with edits, or a request sent back."""
    if req.kind != RequestKind.AUTH_REQUIRED or not isinstance(value, dict):
        return ""
    name = describe_action(req.action).name
    if req.status == RequestStatus.PENDING and value.get("decision") == "approve":
        needed = approvals_needed(req)
        return ngettext(
            "Approval recorded. It needs %(n)s more approval before %(name)s runs.",
            "Approval recorded. It needs %(n)s more approvals before %(name)s runs.",
            needed,
        ) % {"n": needed, "name": name}
    if value.get("decision") == "respond":
        return _("Sent back. The run gets your comment and decides what to do.")
    if (
        value.get("decision") == "approve"
        and isinstance(req.answer, dict)
        and "edited" in req.answer
    ):
        return _("Approved with edits. The run goes on and runs %(name)s as edited.") % {
            "name": name
        }
    return ""


@dashboard_view(require_view=False)
@require_POST
def request_answer(request: HtmxHttpRequest, run_id: str, request_id: str) -> HttpResponse:
    """Answer (or approve / deny) one request. The form names the run, the request and the
    checkpoint it was asked on; the service compares all three before it records anything."""
    req = request_get_for_user(user=request.user, request_id=request_id)
    if req.run_id != run_id:
        raise Http404("No such request.")
    if not request.user.has_perm(permission_for_request_kind(req.kind)):
        raise PermissionDenied(who_can_text(req.kind))
    origin = "run" if request.POST.get("origin") == "run" else "inbox"
    key = form_key(request)
    checkpoint_id = request.POST.get("checkpoint_id", "")
    if key is None or not checkpoint_id or request.POST.get("request_id") != req.id:
        return _reply(
            request,
            req,
            origin=origin,
            status=400,
            message=_("This form is out of date; here is the current state. Please try again."),
            level="error",
        )
    card = build_card(req, user=request.user, origin=origin, data=request.POST)
    if card.approval is not None:
        valid = card.approval.is_valid()
        value = card.approval.value() if valid else None
        if valid and value is not None and value["decision"] == "approve" and card.edit_form:
            # The arguments as the form shows them: the service keeps them only when they
            # differ from what is on the table (an unchanged form is a plain approval).
            valid = card.edit_form.is_valid()
            value["edited"] = card.edit_form.value
    elif card.form is not None:
        valid = card.form.is_valid()
        value = card.form.value
    else:
        valid, value = False, None
    if not valid:
        stale = request_outcome_text(req)
        if stale:
            return _reply(request, req, origin=origin, status=409, message=stale, level="error")
        card.message = _("Check the highlighted fields. Nothing was sent to the run.")
        card.message_level = "error"
        return _invalid_reply(request, card)

    def resume() -> dict[str, Any]:
        run = services.run_resume(
            run_id=run_id,
            request_id=req.id,
            checkpoint_id=checkpoint_id,
            value=value,
            user=request.user,
        )
        return {"run_status": run.status}

    body = {"request_id": req.id, "checkpoint_id": checkpoint_id, "value": value}
    outcome, _replayed = perform_once(request, key=key, body=body, call=resume)
    req.refresh_from_db()
    if outcome.ok:
        return _reply(request, req, origin=origin, status=200, message=_success_text(req, value))
    edit_errors = [
        {**e, "pointer": e["pointer"].removeprefix("/edited") or "/"}
        for e in outcome.extra.get("errors") or []
        if outcome.code == "invalid_input" and str(e.get("pointer", "")).startswith("/edited")
    ]
    if edit_errors and card.edit_form is not None:
        card.edit_form.add_errors(edit_errors)
        card.message = _("Check the highlighted fields. Nothing was sent to the run.")
        card.message_level = "error"
        return _invalid_reply(request, card)
    if outcome.code == "invalid_input" and outcome.extra.get("errors") and card.form is not None:
        # The service's schema check is the last word; show its errors like ours.
        card.form.add_errors(outcome.extra["errors"])
        card.message = _("Check the highlighted fields. Nothing was sent to the run.")
        card.message_level = "error"
        return _invalid_reply(request, card)
    return _reply(
        request,
        req,
        origin=origin,
        status=outcome.status,
        message=_stale_text(req, outcome),
        level="error",
    )


def _stale_text(req: InputRequest, outcome: Outcome) -> str:
    """Say what happened instead, naming who answered and when (never a silent re-run)."""
    if outcome.code.startswith("idempotency_"):
        return outcome.detail  # a key reused for another answer, or still in progress
    return request_outcome_text(req) or outcome.detail


def _reply(
    request: HtmxHttpRequest,
    req: InputRequest,
    *,
    origin: str,
    status: int,
    message: str,
    level: str = "success",
) -> HttpResponse:
    """After a POST: a redirect without JavaScript, else the refreshed card or run panel."""
    if not request.htmx:
        messages.add_message(
            request, messages.SUCCESS if level == "success" else messages.ERROR, message
        )
        fallback = reverse("run-detail", args=[req.run_id]) if origin == "run" else reverse("inbox")
        return redirect_after_post(safe_next(request, fallback))
    if origin == "run":
        return render_run_main(request, req.run_id, message=message, level=level, status=status)
    card = build_card(
        req,
        user=request.user,
        origin=origin,
        message=message,
        message_level=level,
        with_next=True,
    )
    card.expanded = True
    return render(request, "dashboard/inbox.html#answer-reply", {"card": card}, status=status)


def _invalid_reply(request: HtmxHttpRequest, card: RequestCard) -> HttpResponse:
    """Invalid input: the same card, values kept, errors next to their fields (422)."""
    card.expanded = True
    if request.htmx:
        if card.origin == "run":
            return render_run_main(request, card.req.run_id, pending_card=card, status=422)
        return render(request, "dashboard/inbox.html#answer-reply", {"card": card}, status=422)
    if card.origin == "run":
        return render_run_page(request, card.req.run_id, pending_card=card, status=422)
    return _inbox_page(request, replace=card, status=422)
