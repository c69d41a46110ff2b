"""The runs list and the run page: what they show, for whom (the pages and their live
sockets share these)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext as _

from dashboard.actions import decode_cursor, encode_cursor, new_idempotency_key
from dashboard.forms import CancelForm, RetryForm
from dashboard.pages.cards import RequestCard, build_card
from dashboard.pages.pause import pause_context
from dashboard.present import (
    TIMELINE_FILTERS,
    actor_name,
    as_text,
    clock,
    describe_event,
    event_matches,
    event_tone,
    run_status_text,
    span,
    status_tone,
    value_rows,
    waiting_text,
)
from dashboard.timeline import run_chart
from runs import services
from runs.access import Actor
from runs.agents import all_agent_specs
from runs.models import Checkpoint, InputRequest, Run
from runs.selectors import CANCEL, RETRY, run_waiting, runs_for_user, waiting_for_runs
from runs.states import (
    CANCELLABLE,
    RETRYABLE,
    FailureClass,
    RequestKind,
    RequestStatus,
    RunStatus,
)

PAGE_SIZE = 25
TIMELINE_LIMIT = 500

# --- Runs list --------------------------------------------------------------------------------


def run_list_context(user: Actor, params: Mapping[str, str]) -> dict[str, Any]:
    """The runs list for these filters (the page and its live socket share it)."""
    status = params.get("status", "")
    status = status if status in RunStatus.values else ""
    agent = params.get("agent", "")[:100]
    q = params.get("q", "").strip()[:64]
    failure_class = params.get("failure_class", "")
    failure_class = failure_class if failure_class in FailureClass.values else ""
    raw_cursor = params.get("cursor", "")
    cursor = decode_cursor(raw_cursor)
    scoped = runs_for_user(
        user=user, agent=agent or None, q=q or None, failure_class=failure_class or None
    )
    counts = {value: _capped_count(scoped.filter(status=value)) for value in RunStatus.values}
    runs = runs_for_user(
        user=user,
        status=status or None,
        agent=agent or None,
        q=q or None,
        failure_class=failure_class or None,
    ).select_related("current_attempt")
    if cursor is not None:
        when, after_id = cursor
        runs = runs.filter(Q(created_at__lt=when) | Q(created_at=when, id__lt=after_id))
    page = list(runs[: PAGE_SIZE + 1])
    has_more = len(page) > PAGE_SIZE
    page = page[:PAGE_SIZE]
    waiting = waiting_for_runs(page)
    # The registry, not a DISTINCT over every run: that scan grows with the table.
    known_agents = {s.name for s in all_agent_specs()} | ({agent} if agent else set())

    def url(**changes: str) -> str:
        params = {
            "status": status,
            "agent": agent,
            "q": q,
            "failure_class": failure_class,
            **changes,
        }
        return "?" + urlencode({k: v for k, v in params.items() if v})

    status_tabs = [("", _("All"), _capped_count(scoped), url(status=""))] + [
        (value, label, counts[value], url(status=value)) for value, label in RunStatus.choices
    ]
    filters = {"status": status, "agent": agent, "q": q, "failure_class": failure_class}
    if cursor is not None:
        filters["cursor"] = raw_cursor
    return {
        "rows": [_row(run, waiting[run.id]) for run in page],
        "status": status,
        "agent": agent,
        "q": q,
        "failure_class": failure_class,
        "failure_class_label": FailureClass(failure_class).label if failure_class else "",
        "cursor": cursor,
        "agents": sorted(known_agents),
        "status_tabs": status_tabs,
        "next_url": url(cursor=encode_cursor(page[-1].created_at, page[-1].id)) if has_more else "",
        "first_url": url() if cursor is not None else "",
        # The live socket shows the same filters; it sends nothing the page already has.
        "live_query": urlencode({k: v for k, v in filters.items() if v}),
        "live_token": runs_token(page, status_tabs, waiting),
    }


def runs_token(
    page: list[Run],
    status_tabs: list[tuple[str, Any, int | str, str]],
    waiting: dict[str, dict[str, Any] | None] | None = None,
) -> str:
    """Names what a rendered runs table shows: its rows' states, why queued ones wait,
    and the status counts."""
    waits = waiting or {}
    shown = "|".join(
        f"{run.id}:{run.status}:{run.last_event_seq}:{_version(waits.get(run.id))}" for run in page
    )
    counts = ",".join(str(count) for _value, _label, count, _url in status_tabs)
    return hashlib.sha256(f"{shown}#{counts}".encode()).hexdigest()[:16]


# Tab counts stop here: counting a million finished runs would scan them all on every view,
# while "1,000+" tells a person just as much. Each count reads at most this many index rows.
COUNT_CAP = 1_000


def _capped_count(runs: QuerySet[Run]) -> int | str:
    n = runs.order_by()[: COUNT_CAP + 1].count()
    return f"{COUNT_CAP:,}+" if n > COUNT_CAP else n


def _row(run: Run, waiting: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "run": run,
        "status_text": run_status_text(run),
        "waiting": waiting,
        "waiting_text": waiting_text(waiting),
        "tone": status_tone(run.status),
        "created": clock(run.created_at),
        "updated": clock(run.updated_at),
    }


# --- Run page ---------------------------------------------------------------------------------


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


def timeline_rows(run: Run, name: str, *, after: int | None = None) -> list[dict[str, Any]]:
    """The timeline's rows (its last ``TIMELINE_LIMIT``), oldest first; with ``after``,
    only the events numbered above it (what a live page appends)."""
    events = run.events.order_by("-seq")
    if after is not None:
        events = events.filter(seq__gt=after)
    rows = []
    for event in reversed(list(events[:TIMELINE_LIMIT])):
        if name and not event_matches(event, name):
            continue
        rows.append(
            {
                "event": event,
                "text": describe_event(event),
                "tone": event_tone(event),
                "actor": actor_name(event.actor),
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


def run_waiting_context(run: Run) -> dict[str, Any]:
    """Why the run waits, if it does: the run page's line under its status."""
    waiting = run_waiting(run)
    return {"run": run, "waiting": waiting, "waiting_text": waiting_text(waiting)}


def run_shared_context(run: Run, *, timeline: str | None = "") -> dict[str, Any]:
    """What the run page shows every user alike; its live socket renders it once per push
    for all the pages open on the run (``live.consumers``). ``timeline=None``: without
    the timeline's rows (a live push appends only the new ones: ``timeline_rows``)."""
    return {
        **run_waiting_context(run),
        "run": run,
        # The live socket sends nothing older than the events this page was rendered from.
        "live_token": run.last_event_seq,
        "status_text": run_status_text(run),
        "tone": status_tone(run.status),
        "attempts": _attempt_rows(run),
        "retry_budget": services.retry_budget(run),
        "timeline": timeline_rows(run, timeline) if timeline is not None else [],
        "timeline_filter": timeline or "",
        "timeline_filters": [(k, v[0]) for k, v in TIMELINE_FILTERS.items()],
        "checkpoints": _checkpoint_rows(run),
        # The run drawn on a time axis: redrawn whole at every push of the run's events.
        "chart": run_chart(run),
        "input_text": as_text(run.input),
        "input_rows": value_rows(run.input),
        "result_text": as_text(run.result) if run.result is not None else "",
        "result_rows": value_rows(run.result),
        "created": clock(run.created_at),
        "finished": clock(run.finished_at),
        "not_before": clock(run.not_before),
    }


def run_retry_blockers(run: Run) -> list[str]:
    if run.status not in RETRYABLE:
        return []
    return [str(why) for why in services.retry_blockers(run)]


def run_controls_state(run: Run, blockers: list[str]) -> str:
    """Names what the run's controls and pending card offer, whoever looks (a live page
    renders them again for its user only when this changed). The latest checkpoint
    counts only where the retry form lists checkpoints: a running run that checkpoints
    every second must not close a Cancel or Pause form someone is typing in."""
    retryable = run.status in RETRYABLE
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
    requests: RunRequests | None = None,
) -> dict[str, Any]:
    """The run page's context for ``who`` (``request.user`` unless a live push renders it
    for a role): the shared part (``shared`` when the caller already has it) and the cards
    and controls that depend on who looks. ``requests``: the run's requests and
    checkpoints when the caller already read them (a push, once for every role)."""
    user: Actor = request.user if who is None else who
    if requests is None:
        requests = run_requests(run)
    # A pause is shown beside the controls (who, why, since, Continue), not as a form.
    pending = requests.pending
    if pending_card is None and pending is not None and pending.kind != RequestKind.PAUSE:
        pending_card = build_card(pending, user=user, origin="run")
    last_request = None
    if pending_card is None:
        last_request = requests.last
    checkpoints = requests.checkpoints
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
            "cancellable": run.status in CANCELLABLE,
            "retryable": run.status in RETRYABLE,
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


@dataclass
class RunRequests:
    """What the run page's cards and retry form are drawn from: the pending request, the
    last one answered or closed (not a pause), the checkpoints, newest first."""

    pending: InputRequest | None
    last: InputRequest | None
    checkpoints: list[Checkpoint]


def run_requests(run: Run) -> RunRequests:
    pending = None
    if run.pending_request_id:
        pending = InputRequest.objects.select_related("run", "answered_by").get(
            pk=run.pending_request_id
        )
    return run_requests_with(run, pending)


def run_requests_with(run: Run, pending: InputRequest | None) -> RunRequests:
    """``run_requests`` when the pending request is read already."""
    last = None
    if pending is None or pending.kind == RequestKind.PAUSE:
        last = (
            run.input_requests.select_related("run", "answered_by")
            .exclude(status=RequestStatus.PENDING)
            .exclude(kind=RequestKind.PAUSE)
            .order_by("-created_at")
            .first()
        )
    return RunRequests(pending, last, list(run.checkpoints.order_by("-number")))


def _version(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]
