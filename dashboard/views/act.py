"""An approval decided from the e-mail that told a person about it (docs/notifications.md).

``GET /act/<token>`` never decides: it shows the request's card and one confirm form
(after the sign-in page when the session is gone). Mail scanners that fetch every link
in a message therefore decide nothing. The form's POST decides, through the same service
as the dashboard's card (``services.run_resume``: the policy, the run's lock), with the
link (``runs/action_links.py``): only the person it was sent to, only the version of the
request it was sent about, and once for both links of the message. Whatever makes a
link unusable (used, edited since, decided by someone, expired, another person's) is
said in words on the page, with who decided and when.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _

from dashboard.actions import (
    HtmxHttpRequest,
    dashboard_view,
    form_key,
    perform_once,
    redirect_after_post,
    throttled,
)
from dashboard.forms import ApprovalForm
from dashboard.pages.cards import build_card, why_not_text
from dashboard.present import clock, request_outcome_text
from runs import services
from runs.action_links import ActionLink, LinkUse, link_used, read_link
from runs.approvals import why_not_decide
from runs.audit import EMAIL, EMAIL_LINK
from runs.models import InputRequest
from runs.selectors import request_get_for_user
from runs.states import RequestStatus


def _refusal(request: HtmxHttpRequest, text: str, status: int) -> HttpResponse:
    return render(request, "dashboard/act.html", {"refusal": text}, status=status)


def _the_link(
    request: HtmxHttpRequest, token: str
) -> tuple[ActionLink, InputRequest] | HttpResponse:
    """The link and its request, for the person it was sent to; else the page that says
    why: 404 for a token that is not ours or a request this person may not see, 403 for
    another person's link (its request is not shown)."""
    link = read_link(token)
    if link is None:
        return _refusal(
            request,
            _(
                "This link is not valid. Your mail program may have cut it short: open the "
                "request from the dashboard's inbox."
            ),
            404,
        )
    if request.user.pk != link.user_id:
        return _refusal(
            request,
            _(
                "This link was sent to someone else. You are signed in as %(who)s: sign in "
                "as the person it was sent to, or open the request from your inbox."
            )
            % {"who": request.user.get_username()},
            403,
        )
    try:
        req = request_get_for_user(user=request.user, request_id=link.request_id)
    except Http404:
        return _refusal(request, _("There is no such request, or you may no longer see it."), 404)
    return link, req


def _used_text(use: LinkUse) -> str:
    facts = {"when": clock(use.at, zone=True), "who": use.who}
    if use.decision == "approve":
        return _("This e-mail's links were used at %(when)s: %(who)s approved it.") % facts
    return _("This e-mail's links were used at %(when)s: %(who)s denied it.") % facts


def _done_text(decision: str, *, waits: bool) -> str:
    if decision == "approve":
        return (
            _("You approved it. It waits for more approvals.") if waits else _("You approved it.")
        )
    return _("You denied it.")


def why_not(link: ActionLink, req: InputRequest) -> str:
    """Why this link can no longer decide, in words; "" while it can."""
    use = link_used(req.id, link.nonce)
    outcome = request_outcome_text(req)
    if use is not None:
        return " ".join(t for t in (_used_text(use), outcome) if t)
    if outcome:
        return outcome
    if req.edit_round != link.edit_round:
        return _(
            "This request was edited after the e-mail was sent, so its links no longer "
            "decide it. Open it to see what is asked now."
        )
    return ""


@dashboard_view(require_view=False)
def act(request: HtmxHttpRequest, token: str) -> HttpResponse:
    """The confirm page of an e-mail's Approve or Deny link; its POST decides."""
    refused = throttled(request, "act")
    if refused is not None:
        return refused
    found = _the_link(request, token)
    if isinstance(found, HttpResponse):
        return found
    link, req = found
    if request.method == "POST":
        return _decide(request, token, link, req)
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD, POST"})
    return _page(request, token, link, req)


def _page(
    request: HtmxHttpRequest,
    token: str,
    link: ActionLink,
    req: InputRequest,
    *,
    form: ApprovalForm | None = None,
    status: int = 200,
) -> HttpResponse:
    card = build_card(req, user=request.user, origin="link")
    card.read_only = True
    closed = why_not(link, req)
    blocked = ""
    if not closed:
        # The policy's own answer for this decision: a deny is not kept from the run's
        # starter, nor from someone who approved already (they change their mind).
        why = why_not_decide(req, request.user, link.decision)
        if not card.can_answer:
            blocked = card.who_can
        elif why is not None:
            blocked = why_not_text(why, card.team)
    context: dict[str, Any] = {
        "card": card,
        "token": token,
        "link": link,
        "closed": closed,
        "blocked": blocked,
        "form": form or ApprovalForm(initial={"decision": link.decision}),
        "key": card.key,
        "run_url": reverse("run-detail", args=[req.run_id]) + f"#request-{req.id}",
    }
    return render(request, "dashboard/act.html", context, status=status)


def _decide(
    request: HtmxHttpRequest, token: str, link: ActionLink, req: InputRequest
) -> HttpResponse:
    here = reverse("act", args=[token])
    key = form_key(request)
    if key is None:
        messages.error(request, _("This form is out of date; here is the current state."))
        return redirect_after_post(here)
    data = request.POST.copy()
    data["decision"] = link.decision  # the link decides what it says, whatever is posted
    form = ApprovalForm(data)
    if not form.is_valid():
        return _page(request, token, link, req, form=form, status=422)
    value = form.value()

    def decide() -> dict[str, Any]:
        run = services.run_resume(
            run_id=req.run_id,
            request_id=req.id,
            checkpoint_id=req.checkpoint_id,
            value=value,
            user=request.user,
            via=EMAIL,
            identity=EMAIL_LINK,
            link=link,
        )
        return {"run_status": run.status}

    outcome, _replayed = perform_once(
        request, key=key, body={"token": token, "value": value}, call=decide
    )
    req.refresh_from_db()
    if outcome.ok:
        waits = req.status == RequestStatus.PENDING
        messages.success(request, _done_text(link.decision, waits=waits))
    else:
        messages.error(request, why_not(link, req) or outcome.detail)
    return redirect_after_post(here)
