"""Pause on the dashboard: Pause and Continue on the run page, the Agents page with its
gates (the kill switch), and the inbox's Paused tab.

Each action is a thin view: the object and the permission, the form's Idempotency-Key,
then the one service call through ``perform_once``, so a double click is one command.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_POST

from dashboard.actions import (
    HtmxHttpRequest,
    dashboard_view,
    new_idempotency_key,
    redirect_after_post,
    safe_next,
    submit_action,
)
from dashboard.present import actor_name, clock
from dashboard.views.runs import _invalid_run_form, _out_of_date, _run_reply
from runs import services
from runs.access import Actor
from runs.audit import DASHBOARD
from runs.selectors import (
    CANCEL,
    PAUSE_AGENT,
    VIEW,
    agent_overview,
    agents_overview,
    paused_for_user,
    permission_denied_text,
    run_get_for_user,
)
from runs.services import session_identity
from runs.states import RunStatus

MAX_REASON = 2000


class PauseForm(forms.Form):
    reason = forms.CharField(
        max_length=MAX_REASON,
        strip=True,
        widget=forms.Textarea,
        label=gettext_lazy("Reason"),
        error_messages={"required": gettext_lazy("Say why you pause; everyone sees it.")},
    )


@dashboard_view(require_view=False)
@require_POST
def run_pause(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_get_for_user(user=request.user, run_id=run_id, perm=CANCEL)

    def pause(data: dict[str, Any]) -> dict[str, Any]:
        paused = services.run_pause(
            run_id=run.id,
            reason=data["reason"],
            user=request.user,
            via=DASHBOARD,
            identity=session_identity(request.session),
        )
        return {"run_status": paused.status}

    done = submit_action(
        request,
        ids={"run_id": run.id},
        form=PauseForm(request.POST),
        perform=pause,
        stale=lambda: _out_of_date(request, run),
        invalid=lambda form: _invalid_run_form(request, run, pause_form=form),
    )
    if isinstance(done, HttpResponse):
        return done
    outcome = done.outcome
    run.refresh_from_db()
    if outcome.ok and outcome.extra.get("run_status") == RunStatus.PAUSE_REQUESTED:
        message = _("Pause accepted. The running step finishes; the run pauses at its next step.")
    elif outcome.ok:
        message = _("Run paused.")
    else:
        message = outcome.detail
    return _run_reply(request, run, outcome=outcome, message=message)


@dashboard_view(require_view=False)
@require_POST
def run_continue(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Continue a paused run: the resume of its pause request on its checkpoint, so a tab
    that shows an older pause is refused (the same compare-and-set as every answer)."""
    run = run_get_for_user(user=request.user, run_id=run_id, perm=CANCEL)
    request_id = request.POST.get("request_id", "")[:40]
    if not request_id:
        return _out_of_date(request, run)

    def proceed(data: dict[str, Any]) -> dict[str, Any]:
        continued = services.run_resume(
            run_id=run.id,
            request_id=data["request_id"],
            checkpoint_id=data["checkpoint_id"],
            value=None,
            user=request.user,
            via=DASHBOARD,
            identity=session_identity(request.session),
        )
        return {"run_status": continued.status}

    done = submit_action(
        request,
        ids={"run_id": run.id},
        values={
            "request_id": request_id,
            "checkpoint_id": request.POST.get("checkpoint_id", "")[:40] or None,
        },
        perform=proceed,
        stale=lambda: _out_of_date(request, run),
    )
    if isinstance(done, HttpResponse):
        return done
    outcome = done.outcome
    run.refresh_from_db()
    if outcome.ok:
        message = _("Run continued: a new attempt goes on from the checkpoint.")
    elif outcome.code in ("request_mismatch", "stale_checkpoint", "invalid_state"):
        message = _("This pause is out of date (%(detail)s) Here is the run as it is now.") % {
            "detail": outcome.detail
        }
    else:
        message = outcome.detail
    return _run_reply(request, run, outcome=outcome, message=message)


# --- The Agents page ------------------------------------------------------------------


def agents_context(user: Actor) -> dict[str, Any]:
    rows = agents_overview()
    for row in rows:
        row["since"] = clock(row["paused_since"])
        row["paused_by_name"] = actor_name(row["paused_by"] or "")
        row["statuses"] = [
            (status, label, row["runs_by_status"].get(status, 0))
            for status, label in RunStatus.choices
            if row["runs_by_status"].get(status, 0)
        ]
        row["key"] = new_idempotency_key()
        row["confirm"] = _(
            "%(running)s running attempts will stop at their next step; "
            "%(queued)s queued runs will wait."
        ) % {"running": row["running_attempts"], "queued": row["held_runs"]}
    return {"agents": rows, "can_pause_agent": user.has_perm(PAUSE_AGENT)}


@dashboard_view()
@require_GET
def agent_list(request: HtmxHttpRequest) -> HttpResponse:
    context = agents_context(request.user)
    if request.htmx and request.htmx.target == "agents-table":
        return render(request, "dashboard/agents.html#agents-table", context)
    return render(request, "dashboard/agents.html", context)


@dashboard_view()
@require_GET
def agent_pause_confirm(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """The confirm dialog: how many running attempts will stop and queued runs will wait."""
    if not request.user.has_perm(PAUSE_AGENT):
        raise PermissionDenied(permission_denied_text(PAUSE_AGENT))
    row = next((r for r in agents_context(request.user)["agents"] if r["name"] == name), None)
    if row is None:
        raise Http404("No such agent.")
    return render(request, "dashboard/agent_pause.html", {"row": row})


@dashboard_view()
@require_POST
def agent_gate(request: HtmxHttpRequest, name: str, action: str) -> HttpResponse:
    """Pause or unpause an agent from the Agents page (``action`` is the URL's)."""
    if not request.user.has_perm(PAUSE_AGENT):
        raise PermissionDenied(permission_denied_text(PAUSE_AGENT))
    back = reverse("agent-list")
    if action not in ("pause", "unpause") or agent_overview(name[:100]) is None:
        raise Http404("No such agent.")
    reason = request.POST.get("reason", "").strip()
    if action == "pause" and (not reason or len(reason) > MAX_REASON):
        messages.error(request, _("Say why you pause the agent (1 to 2,000 characters)."))
        return redirect_after_post(back)

    def stale() -> HttpResponse:
        messages.error(request, _("This form is out of date; please try again."))
        return redirect_after_post(back)

    def call(data: dict[str, Any]) -> dict[str, Any]:
        if action == "pause":
            services.agent_pause(
                agent=name,
                reason=reason,
                user=request.user,
                via=DASHBOARD,
                identity=session_identity(request.session),
            )
        else:
            services.agent_unpause(
                agent=name,
                reason=reason[:MAX_REASON],
                user=request.user,
                via=DASHBOARD,
                identity=session_identity(request.session),
            )
        return {}

    done = submit_action(
        request,
        ids={},
        values={"agent": name, "action": action, "reason": reason},
        perform=call,
        stale=stale,
    )
    if isinstance(done, HttpResponse):
        return done
    outcome = done.outcome
    if outcome.ok:
        text = _("Agent %(agent)s paused.") if action == "pause" else _("Agent %(agent)s unpaused.")
        messages.success(request, text % {"agent": name})
    else:
        messages.error(request, outcome.detail)
    if request.htmx:
        response = render(
            request, "dashboard/agents.html#agents-table", agents_context(request.user)
        )
        return response
    return redirect_after_post(safe_next(request, back))


# --- The inbox's Paused tab -------------------------------------------------------------


def paused_rows(user: Actor) -> list[dict[str, Any]]:
    rows = []
    for request in paused_for_user(user=user)[:200]:
        context = request.context or {}
        rows.append(
            {
                "request": request,
                "run": request.run,
                "who": actor_name(str(context.get("paused_by") or "")),
                "why": request.prompt,
                "since": clock(request.created_at),
                "step": context.get("step") or "",
                "breakpoint": context.get("breakpoint") or "",
            }
        )
    return rows


@dashboard_view()
@require_GET
def inbox_paused(request: HtmxHttpRequest) -> HttpResponse:
    """Paused runs, longest paused first, for people who may continue them."""
    may = request.user.has_perm(VIEW) and request.user.has_perm(CANCEL)
    context = {"rows": paused_rows(request.user) if may else [], "may_continue": may}
    if request.htmx and request.htmx.target == "paused-table":
        return render(request, "dashboard/paused.html#paused-table", context)
    return render(request, "dashboard/paused.html", context)
