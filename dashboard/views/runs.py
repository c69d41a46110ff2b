"""The runs list, the run page with its panels, and the cancel and retry actions."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from dashboard.actions import (
    HtmxHttpRequest,
    Outcome,
    dashboard_view,
    decode_cursor,
    encode_cursor,
    new_idempotency_key,
    redirect_after_post,
    safe_next,
    submit_action,
)
from dashboard.forms import CancelForm, RetryForm
from dashboard.present import (
    TIMELINE_FILTERS,
    as_text,
    clock,
    describe_event,
    event_matches,
    event_tone,
    run_status_text,
    span,
    status_tone,
    value_rows,
)
from dashboard.views.cards import RequestCard, build_card
from runs import services
from runs.access import Actor
from runs.agents import all_agent_specs
from runs.events import EventType
from runs.models import Attempt, Checkpoint, InputRequest, Run, RunEvent
from runs.selectors import CANCEL, RETRY, run_get_for_user, runs_for_user
from runs.states import CANCELLABLE, RequestKind, RequestStatus, RunStatus

PAGE_SIZE = 25
TIMELINE_LIMIT = 500

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


def run_list_context(user: Actor, params: Mapping[str, str]) -> dict[str, Any]:
    """The runs list for these filters (the page and its live socket share it)."""
    status = params.get("status", "")
    status = status if status in RunStatus.values else ""
    agent = params.get("agent", "")[:100]
    q = params.get("q", "").strip()[:64]
    raw_cursor = params.get("cursor", "")
    cursor = decode_cursor(raw_cursor)
    scoped = runs_for_user(user=user, agent=agent or None, q=q or None)
    counts = {value: _capped_count(scoped.filter(status=value)) for value in RunStatus.values}
    runs = runs_for_user(
        user=user, status=status or None, agent=agent or None, q=q or None
    ).select_related("current_attempt")
    if cursor is not None:
        when, after_id = cursor
        runs = runs.filter(Q(created_at__lt=when) | Q(created_at=when, id__lt=after_id))
    page = list(runs[: PAGE_SIZE + 1])
    has_more = len(page) > PAGE_SIZE
    page = page[:PAGE_SIZE]
    # The registry, not a DISTINCT over every run: that scan grows with the table.
    known_agents = {s.name for s in all_agent_specs()} | ({agent} if agent else set())

    def url(**changes: str) -> str:
        params = {"status": status, "agent": agent, "q": q, **changes}
        return "?" + urlencode({k: v for k, v in params.items() if v})

    status_tabs = [("", _("All"), _capped_count(scoped), url(status=""))] + [
        (value, label, counts[value], url(status=value)) for value, label in RunStatus.choices
    ]
    filters = {"status": status, "agent": agent, "q": q}
    if cursor is not None:
        filters["cursor"] = raw_cursor
    return {
        "rows": [_row(run) for run in page],
        "status": status,
        "agent": agent,
        "q": q,
        "cursor": cursor,
        "agents": sorted(known_agents),
        "status_tabs": status_tabs,
        "next_url": url(cursor=encode_cursor(page[-1].created_at, page[-1].id)) if has_more else "",
        "first_url": url() if cursor is not None else "",
        # The live socket shows the same filters; it sends nothing the page already has.
        "live_query": urlencode({k: v for k, v in filters.items() if v}),
        "live_token": runs_token(page, status_tabs),
    }


def runs_token(page: list[Run], status_tabs: list[tuple[str, Any, int | str, str]]) -> str:
    """Names what a rendered runs table shows: its rows' states and the status counts."""
    shown = "|".join(f"{run.id}:{run.status}:{run.last_event_seq}" for run in page)
    counts = ",".join(str(count) for _value, _label, count, _url in status_tabs)
    return hashlib.sha256(f"{shown}#{counts}".encode()).hexdigest()[:16]


# Tab counts stop here: counting a million finished runs would scan them all on every view,
# while "1,000+" tells a person just as much. Each count reads at most this many index rows.
COUNT_CAP = 1_000


def _capped_count(runs: QuerySet[Run]) -> int | str:
    n = runs.order_by()[: COUNT_CAP + 1].count()
    return f"{COUNT_CAP:,}+" if n > COUNT_CAP else n


def _row(run: Run) -> dict[str, Any]:
    return {
        "run": run,
        "status_text": run_status_text(run),
        "tone": status_tone(run.status),
        "created": clock(run.created_at),
        "updated": clock(run.updated_at),
    }


# --- Run page --------------------------------------------------------------------------------


def _actor_name(actor: str) -> str:
    return actor.split(":", 1)[1] if actor.startswith("user:") else actor


def _last_event(run: Run, event_type: str) -> RunEvent | None:
    return run.events.filter(type=event_type).order_by("-seq").first()


def _attempt_rows(run: Run) -> list[dict[str, Any]]:
    now = timezone.now()
    rows = []
    for attempt in run.attempts.select_related("resume_from").order_by("number"):
        duration = ""
        if attempt.started_at:
            end = attempt.ended_at or now
            duration = span((end - attempt.started_at).total_seconds())
        rows.append(
            {
                "attempt": attempt,
                "started": clock(attempt.started_at),
                "duration": duration,
                "live": attempt.ended_at is None and attempt.started_at is not None,
            }
        )
    return rows


def _timeline(run: Run, name: str) -> list[dict[str, Any]]:
    events = run.events.order_by("-seq")[:TIMELINE_LIMIT]
    rows = []
    for event in reversed(list(events)):
        if name and not event_matches(event, name):
            continue
        rows.append(
            {
                "event": event,
                "text": describe_event(event),
                "tone": event_tone(event),
                "actor": _actor_name(event.actor),
                "when": clock(event.created_at),
                "payload": as_text(event.payload) if event.payload else "",
            }
        )
    return rows


def _checkpoint_rows(run: Run) -> list[dict[str, Any]]:
    return [
        {
            "checkpoint": cp,
            "when": clock(cp.created_at),
            "state": as_text(cp.state),
            "is_latest": cp.id == run.latest_checkpoint_id,
        }
        for cp in run.checkpoints.select_related("attempt").order_by("-number")
    ]


def run_shared_context(run: Run, *, timeline: str = "") -> dict[str, Any]:
    """What the run page shows every user alike; its live socket renders it once per push
    for all the pages open on the run (``live.consumers``)."""
    return {
        "run": run,
        # The live socket sends nothing older than the events this page was rendered from.
        "live_token": run.last_event_seq,
        "status_text": run_status_text(run),
        "tone": status_tone(run.status),
        "attempts": _attempt_rows(run),
        "retry_budget": services.retry_budget(run),
        "timeline": _timeline(run, timeline),
        "timeline_filter": timeline,
        "timeline_filters": [(k, v[0]) for k, v in TIMELINE_FILTERS.items()],
        "checkpoints": _checkpoint_rows(run),
        "input_text": as_text(run.input),
        "input_rows": value_rows(run.input),
        "result_text": as_text(run.result) if run.result is not None else "",
        "result_rows": value_rows(run.result),
        "created": clock(run.created_at),
        "finished": clock(run.finished_at),
        "not_before": clock(run.not_before),
    }


def run_retry_blockers(run: Run) -> list[str]:
    if run.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
        return []
    return [str(why) for why in services.retry_blockers(run)]


def run_controls_state(run: Run, blockers: list[str]) -> str:
    """Names what the run's controls and pending card offer, whoever looks (a live page
    renders them again for its user only when this changed). The latest checkpoint
    counts only where the retry form lists checkpoints: a running run that checkpoints
    every second must not close a Cancel or Pause form someone is typing in."""
    retryable = run.status in (RunStatus.FAILED, RunStatus.CANCELLED)
    checkpoint = run.latest_checkpoint_id if retryable else None
    return _version(run.status, run.pending_request_id, checkpoint, blockers)


def run_context(
    request: HttpRequest,
    run: Run,
    *,
    pending_card: RequestCard | None = None,
    cancel_form: CancelForm | None = None,
    retry_form: RetryForm | None = None,
    message: str = "",
    level: str = "info",
    message_while: tuple[str, ...] = (),
    timeline: str = "",
    shared: dict[str, Any] | None = None,
    retry_blockers: list[str] | None = None,
    pause_form: Any = None,
    who: Actor | None = None,
) -> dict[str, Any]:
    """The run page's context for ``who`` (``request.user`` unless a live push renders it
    for a role): the shared part (``shared`` when the caller already has it) and the cards
    and controls that depend on who looks."""
    from dashboard.views.pause import pause_context

    user: Actor = request.user if who is None else who
    if pending_card is None and run.pending_request_id:
        req = InputRequest.objects.select_related("run", "answered_by").get(
            pk=run.pending_request_id
        )
        # A pause is shown beside the controls (who, why, since, Continue), not as a form.
        if req.kind != RequestKind.PAUSE:
            pending_card = build_card(req, user=user, origin="run")
    last_request = None
    if pending_card is None:
        last_request = (
            run.input_requests.select_related("run", "answered_by")
            .exclude(status=RequestStatus.PENDING)
            .exclude(kind=RequestKind.PAUSE)
            .order_by("-created_at")
            .first()
        )
    checkpoints = list(run.checkpoints.order_by("-number"))
    if retry_blockers is None:
        retry_blockers = run_retry_blockers(run)
    can_cancel = user.has_perm(CANCEL)
    can_retry = user.has_perm(RETRY)
    context = dict(shared) if shared is not None else run_shared_context(run, timeline=timeline)
    if message_while and run.status not in message_while:
        # The message is about a state the run has left already ("Retry queued" beside a
        # red Failed): say nothing rather than something that is no longer true.
        message = ""
    context.update(
        {
            "message": message,
            "message_level": level,
            "message_while": " ".join(message_while),
            "pending_card": pending_card,
            "last_card": (
                build_card(last_request, user=user, origin="run") if last_request else None
            ),
            "can_cancel": can_cancel,
            "can_retry": can_retry,
            # A live push keeps the cancel and retry forms (and what is typed in them)
            # unless what they offer changed.
            "controls_version": _version(
                run_controls_state(run, retry_blockers), can_cancel, can_retry
            ),
            "cancellable": run.status in CANCELLABLE and run.status != RunStatus.CANCEL_REQUESTED,
            "retryable": run.status in (RunStatus.FAILED, RunStatus.CANCELLED),
            "retry_blockers": retry_blockers,
            "cancel_form": cancel_form or CancelForm(),
            "cancel_key": new_idempotency_key(),
            "retry_form": retry_form or RetryForm(checkpoints=checkpoints),
            "retry_key": new_idempotency_key(),
            "cancel_open": cancel_form is not None and bool(cancel_form.errors),
            **pause_context(run, user),
            "pause_form": pause_form,
            "pause_open": pause_form is not None and bool(pause_form.errors),
            "retry_open": retry_form is not None and bool(retry_form.errors),
        }
    )
    return context


def _version(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


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
        "timeline": _timeline(run, name),
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
    return text % {"who": _actor_name(event.actor), "when": clock(event.created_at)}


@dashboard_view(require_view=False)
@require_POST
def run_cancel(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_get_for_user(user=request.user, run_id=run_id, perm=CANCEL)

    def cancel(data: dict[str, Any]) -> dict[str, Any]:
        cancelled = services.run_cancel(run_id=run.id, user=request.user, reason=data["reason"])
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
