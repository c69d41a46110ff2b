"""The inbox, and answering a request (input or approval) from the inbox or the run page.

What the list shows is built in ``dashboard.pages.inbox`` (its live socket renders the
same); these views render it and take the answers.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_GET, require_POST

from dashboard.actions import (
    HtmxHttpRequest,
    Outcome,
    dashboard_view,
    decode_cursor,
    form_key,
    perform_once,
    redirect_after_post,
    safe_next,
)
from dashboard.forms import answer_submission
from dashboard.pages.cards import RequestCard, build_card, who_can_text
from dashboard.pages.inbox import TABS, inbox_context
from dashboard.present import describe_action, request_outcome_text
from dashboard.views.runs import render_run_main, render_run_page
from runs import services
from runs.approvals import approvals_needed
from runs.audit import DASHBOARD
from runs.models import InputRequest
from runs.selectors import permission_for_request_kind, request_get_for_user
from runs.services import session_identity
from runs.states import RequestKind, RequestStatus


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
    submitted = answer_submission(req, request.POST)
    if not submitted.valid:
        stale = request_outcome_text(req)
        if stale:
            return _reply(request, req, origin=origin, status=409, message=stale, level="error")
        # The card with the person's values and the forms' errors.
        card = build_card(req, user=request.user, origin=origin, data=request.POST)
        # The forms find their errors when asked, as answer_submission asked them.
        if card.approval is not None:
            if card.approval.is_valid() and card.edit_form is not None:
                card.edit_form.is_valid()
        elif card.form is not None:
            card.form.is_valid()
        card.message = _("Check the highlighted fields. Nothing was sent to the run.")
        card.message_level = "error"
        return _invalid_reply(request, card)
    value = submitted.value

    def resume() -> dict[str, Any]:
        run = services.run_resume(
            run_id=run_id,
            request_id=req.id,
            checkpoint_id=checkpoint_id,
            value=value,
            user=request.user,
            via=DASHBOARD,
            identity=session_identity(request.session),
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
    card = build_card(req, user=request.user, origin=origin, data=request.POST)
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
