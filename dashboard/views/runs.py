"""The runs list, the run page with its panels, and the cancel and retry actions.

What the pages show is built in ``dashboard.pages.runs`` (their live sockets render the
same); these views render it and take the actions.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from dashboard.actions import (
    HtmxHttpRequest,
    Outcome,
    dashboard_view,
    redirect_after_post,
    safe_next,
    submit_action,
)
from dashboard.forms import CancelForm, RetryForm
from dashboard.pages.runs import run_context, run_list_context, timeline_rows
from dashboard.present import TIMELINE_FILTERS, actor_name, clock, run_status_text
from runs import services
from runs.audit import DASHBOARD
from runs.events import EventType
from runs.models import Attempt, Checkpoint, Run, RunEvent
from runs.selectors import CANCEL, RETRY, run_get_for_user, runs_for_user
from runs.services import session_identity
from runs.states import RunStatus

# --- Runs list --------------------------------------------------------------------------------


@dashboard_view()
@require_GET
def run_list(request: HtmxHttpRequest) -> HttpResponse:
    """Runs, newest first: filter by status and agent, search by id, cursor pages."""
    context = run_list_context(request.user, request.GET)
    q, status, cursor = context["q"], context["status"], context["cursor"]
    if q and not status and not cursor and not request.htmx:
        # A full id that names one run goes straight to it.
        agent = context["agent"] or None
        if runs_for_user(user=request.user, agent=agent, q=q).filter(pk=q).exists():
            return redirect("run-detail", run_id=q)
    if request.htmx and request.htmx.target == "runs-table":
        return render(request, "dashboard/run_list.html#runs-table", context)
    return render(request, "dashboard/run_list.html", context)


# --- Run page --------------------------------------------------------------------------------


def _last_event(run: Run, event_type: str) -> RunEvent | None:
    return run.events.filter(type=event_type).order_by("-seq").first()


def render_run_page(
    request: HtmxHttpRequest, run_id: str, *, status: int = 200, **kwargs: Any
) -> HttpResponse:
    run = run_get_for_user(user=request.user, run_id=run_id)
    return render(
        request, "dashboard/run_detail.html", run_context(request, run, **kwargs), status=status
    )


def render_run_main(
    request: HtmxHttpRequest, run_id: str, *, status: int = 200, **kwargs: Any
) -> HttpResponse:
    """The run page's main panel, swapped in after an action, with a fresh form and key."""
    run = run_get_for_user(user=request.user, run_id=run_id)
    return render(
        request,
        "dashboard/run_detail.html#run-reply",
        run_context(request, run, **kwargs),
        status=status,
    )


@dashboard_view(require_view=False)
@require_GET
def run_detail(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    timeline = request.GET.get("events", "")
    timeline = timeline if timeline in TIMELINE_FILTERS else ""
    return render_run_page(request, run_id, timeline=timeline)


@dashboard_view(require_view=False)
@require_GET
def run_timeline(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """The timeline panel alone, filtered (Failures, Human decisions, Side effects)."""
    run = run_get_for_user(user=request.user, run_id=run_id)
    name = request.GET.get("events", "")
    name = name if name in TIMELINE_FILTERS else ""
    if not request.htmx:
        return redirect(f"{reverse('run-detail', args=[run.id])}?events={name}#timeline")
    context = {
        "run": run,
        "timeline": timeline_rows(run, name),
        "timeline_filter": name,
        "timeline_filters": [(k, v[0]) for k, v in TIMELINE_FILTERS.items()],
    }
    return render(request, "dashboard/run_detail.html#run-timeline", context)


# --- Cancel and retry ------------------------------------------------------------------------


def _run_reply(
    request: HtmxHttpRequest, run: Run, *, outcome: Outcome, message: str, **kwargs: Any
) -> HttpResponse:
    level = "success" if outcome.ok else "error"
    if not request.htmx:
        kwargs.pop("message_while", None)
        messages.add_message(request, messages.SUCCESS if outcome.ok else messages.ERROR, message)
        return redirect_after_post(safe_next(request, reverse("run-detail", args=[run.id])))
    return render_run_main(
        request, run.id, message=message, level=level, status=outcome.status, **kwargs
    )


def _invalid_run_form(request: HtmxHttpRequest, run: Run, **form: Any) -> HttpResponse:
    """A run page action's form with errors: the page (or its main part) with the form open."""
    if request.htmx:
        return render_run_main(request, run.id, status=422, **form)
    return render_run_page(request, run.id, status=422, **form)


def _out_of_date(request: HtmxHttpRequest, run: Run) -> HttpResponse:
    outcome = Outcome(ok=False, code="malformed_request", status=400)
    message = _("This form is out of date; here is the current state. Please try again.")
    return _run_reply(request, run, outcome=outcome, message=message)


def _already(run: Run, event_type: str, text: str) -> str:
    event = _last_event(run, event_type)
    if event is None:
        return ""
    return text % {"who": actor_name(event.actor), "when": clock(event.created_at)}


@dashboard_view(require_view=False)
@require_POST
def run_cancel(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_get_for_user(user=request.user, run_id=run_id, perm=CANCEL)

    def cancel(data: dict[str, Any]) -> dict[str, Any]:
        cancelled = services.run_cancel(
            run_id=run.id,
            user=request.user,
            reason=data["reason"],
            via=DASHBOARD,
            identity=session_identity(request.session),
        )
        return {"run_status": cancelled.status}

    done = submit_action(
        request,
        ids={"run_id": run.id},
        form=CancelForm(request.POST),
        perform=cancel,
        stale=lambda: _out_of_date(request, run),
        invalid=lambda form: _invalid_run_form(request, run, cancel_form=form),
    )
    if isinstance(done, HttpResponse):
        return done
    outcome = done.outcome
    run.refresh_from_db()
    while_: tuple[str, ...] = ()
    if outcome.ok and outcome.extra.get("run_status") == RunStatus.CANCEL_REQUESTED:
        message = _("Cancel accepted. The running step stops at its next safe point.")
        # Gone once the run shows Cancelled (app.js, on the pushed status).
        while_ = (RunStatus.CANCEL_REQUESTED, RunStatus.RUNNING)
    elif outcome.ok:
        message = _("Run cancelled.")
    elif outcome.code.startswith("idempotency_"):
        message = outcome.detail
    else:
        message = _already(
            run, EventType.RUN_CANCEL_REQUESTED, _("Already cancelled by %(who)s at %(when)s.")
        )
        if not message or run.status not in (RunStatus.CANCELLED, RunStatus.CANCEL_REQUESTED):
            message = _("Nothing to cancel: the run is %(status)s.") % {
                "status": run_status_text(run).lower()
            }
    return _run_reply(request, run, outcome=outcome, message=message, message_while=while_)


@dashboard_view(require_view=False)
@require_POST
def run_retry(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_get_for_user(user=request.user, run_id=run_id, perm=RETRY)
    checkpoints = list(Checkpoint.objects.filter(run=run).order_by("-number"))

    def retry(data: dict[str, Any]) -> dict[str, Any]:
        retried = services.run_retry(
            run_id=run.id,
            reason=data["reason"],
            from_checkpoint_id=data.get("from_checkpoint") or None,
            user=request.user,
            via=DASHBOARD,
            identity=session_identity(request.session),
        )
        attempt = Attempt.objects.get(pk=retried.current_attempt_id)
        checkpoint = attempt.resume_from
        return {"attempt": attempt.number, "checkpoint": checkpoint.number if checkpoint else 0}

    done = submit_action(
        request,
        ids={"run_id": run.id},
        form=RetryForm(request.POST, checkpoints=checkpoints),
        perform=retry,
        stale=lambda: _out_of_date(request, run),
        invalid=lambda form: _invalid_run_form(request, run, retry_form=form),
    )
    if isinstance(done, HttpResponse):
        return done
    outcome = done.outcome
    run.refresh_from_db()
    while_: tuple[str, ...] = ()
    if outcome.ok:
        # True while the new attempt is on its way; gone when the run fails or ends again.
        while_ = (
            RunStatus.QUEUED,
            RunStatus.RUNNING,
            RunStatus.WAITING,
            RunStatus.INPUT_REQUIRED,
            RunStatus.AUTH_REQUIRED,
        )
        if outcome.extra.get("checkpoint"):
            message = _("Retry queued: attempt %(n)s continues from checkpoint #%(cp)s.") % {
                "n": outcome.extra.get("attempt"),
                "cp": outcome.extra.get("checkpoint"),
            }
        else:
            message = _("Retry queued: attempt %(n)s starts from the beginning.") % {
                "n": outcome.extra.get("attempt")
            }
    elif outcome.code.startswith("idempotency_"):
        message = outcome.detail
    elif outcome.code == "invalid_state" and run.status not in (
        RunStatus.FAILED,
        RunStatus.CANCELLED,
    ):
        message = _already(
            run, EventType.RUN_RETRIED, _("Already retried by %(who)s at %(when)s.")
        ) or _("Cannot retry: the run is %(status)s.") % {"status": run_status_text(run).lower()}
    else:
        message = outcome.detail
    return _run_reply(request, run, outcome=outcome, message=message, message_while=while_)
