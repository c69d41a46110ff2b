"""Reads that check permission. Views, APIs and consumers get runs and requests here.

A user without ``runs.view_run`` is an outsider: every run is "not found" for them,
so the existence of a run never leaks. A user who may see a run but not act on it
gets ``PermissionDenied`` (healthchecks ``_get_rw_check_for_user``).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import QuerySet
from django.http import Http404
from django.utils.translation import gettext

from runs import rows
from runs.access import Actor
from runs.models import AgentGate, Attempt, InputRequest, Run
from runs.states import RequestKind, RequestStatus, RunStatus

VIEW = "runs.view_run"
ANSWER = "runs.answer_run"
APPROVE = "runs.approve_run"
CANCEL = "runs.cancel_run"
RETRY = "runs.retry_run"
START = "runs.start_run"
PAUSE_AGENT = "runs.pause_agent"


def permission_for_request_kind(kind: str) -> str:
    """Answering a question and approving an action are different permissions; continuing
    a paused run takes the permission that paused it (``cancel_run``)."""
    if kind == RequestKind.PAUSE:
        return CANCEL
    return APPROVE if kind == RequestKind.AUTH_REQUIRED else ANSWER


def run_get_for_user(
    *, user: Actor, run_id: str, perm: str | None = None, related: bool = False
) -> Run:
    """Return the run, or raise Http404 (no such run, or an outsider) / PermissionDenied.

    ``related``: with its current attempt and pending request loaded (in the same
    statement on PostgreSQL), as its representation shows them."""
    if not user.is_authenticated or not user.has_perm(VIEW):
        raise Http404("No such run.")
    run = _run_with_related(run_id) if related else rows.get(Run, run_id)
    if run is None:
        raise Http404("No such run.")
    if perm is not None and not user.has_perm(perm):
        raise PermissionDenied(
            gettext("You do not have the %(perm)s permission.") % {"perm": perm.split(".")[1]}
        )
    return run


def _run_with_related(run_id: str) -> Run | None:
    if connection.vendor != "postgresql":
        return (
            Run.objects.select_related(
                "current_attempt", "pending_request", "pending_request__answered_by"
            )
            .filter(pk=run_id)
            .first()
        )
    sql = (
        f"SELECT {rows.columns(Run, 'r')}, {rows.columns(Attempt, 'a')}, "  # noqa: S608 - names from the models
        f"{rows.columns(InputRequest, 'q')} "
        f'FROM "{Run._meta.db_table}" r '
        f'LEFT JOIN "{Attempt._meta.db_table}" a ON a."id" = r."current_attempt_id" '
        f'LEFT JOIN "{InputRequest._meta.db_table}" q ON q."id" = r."pending_request_id" '
        'WHERE r."id" = %s'
    )
    found = rows.fetch(Run, sql, [run_id])
    if found is None:
        return None
    run, rest = found
    attempt_values = rest[: rows.width(Attempt)]
    request_values = rest[rows.width(Attempt) :]
    if run.current_attempt_id is not None and attempt_values[0] is not None:
        run.current_attempt = rows.build(Attempt, attempt_values)
    if run.pending_request_id is not None and request_values[0] is not None:
        run.pending_request = rows.build(InputRequest, request_values)
    return run


def runs_for_user(
    *, user: Actor, status: str | None = None, agent: str | None = None, q: str | None = None
) -> QuerySet[Run]:
    if not user.is_authenticated or not user.has_perm(VIEW):
        return Run.objects.none()
    runs = Run.objects.all()
    if status:
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent=agent)
    if q:
        runs = runs.filter(pk__startswith=q.strip())
    return runs.order_by("-created_at", "-id")


def answerable_kinds(user: Actor) -> list[str]:
    kinds: list[str] = []
    if user.has_perm(ANSWER):
        kinds.append(RequestKind.INPUT_REQUIRED)
    if user.has_perm(APPROVE):
        kinds.append(RequestKind.AUTH_REQUIRED)
    return kinds


def inbox_for_user(
    *, user: Actor, mine_only: bool = True, pauses: bool = False
) -> QuerySet[InputRequest]:
    """Pending requests, soonest expiry first. ``mine_only``: only kinds the user may answer.
    Paused runs have their own tab (``paused_for_user``); ``pauses`` includes them (API).

    The inbox badge and the list both come from this one query (docs/dashboard.md).
    """
    if not user.is_authenticated or not user.has_perm(VIEW):
        return InputRequest.objects.none()
    requests = InputRequest.objects.filter(status=RequestStatus.PENDING)
    if mine_only:
        requests = requests.filter(kind__in=answerable_kinds(user))
    elif not pauses:
        requests = requests.exclude(kind=RequestKind.PAUSE)
    return requests.select_related("run").order_by("expires_at", "id")


def request_get_for_user(*, user: Actor, request_id: str) -> InputRequest:
    if not user.is_authenticated or not user.has_perm(VIEW):
        raise Http404("No such request.")
    request = (
        InputRequest.objects.select_related("run", "answered_by").filter(pk=request_id).first()
    )
    if request is None:
        raise Http404("No such request.")
    return request


def agents_overview() -> list[dict[str, Any]]:
    """Every agent with its gate (open or paused: who, why, since when), its live runs by
    status, how many runs the gate holds and how many attempts are running. Two queries
    besides the registry: the counts by (agent, status) and the gates."""
    from django.db.models import Count

    from runs.agents import all_agent_specs
    from runs.states import TERMINAL

    # Live runs only: run_status_created_idx serves this (status leads it), so the page's
    # poll reads the runs that are not finished, not every run ever made.
    live = [status for status in RunStatus.values if status not in TERMINAL]
    counts: dict[str, dict[str, int]] = {}
    for agent, status, n in (
        Run.objects.filter(status__in=live)
        .values_list("agent", "status")
        .annotate(n=Count("id"))
        .order_by()
    ):
        counts.setdefault(agent, {})[status] = n
    gates = {gate.agent: gate for gate in AgentGate.objects.select_related("paused_by")}
    rows: list[dict[str, Any]] = []
    for spec in all_agent_specs():
        by_status = counts.get(spec.name, {})
        gate = gates.get(spec.name)
        paused = bool(gate and gate.paused)
        rows.append(
            {
                "spec": spec,
                "name": spec.name,
                "state": "paused" if paused else "open",
                "paused": paused,
                "paused_by": gate.actor if paused and gate else None,
                "pause_reason": gate.reason if paused and gate else None,
                "paused_since": gate.paused_at if paused and gate else None,
                "runs_by_status": by_status,
                "running_attempts": by_status.get(RunStatus.RUNNING, 0),
                # What the gate holds while it is shut: runs that would be claimed otherwise.
                "held_runs": by_status.get(RunStatus.QUEUED, 0)
                + by_status.get(RunStatus.WAITING, 0),
            }
        )
    return rows


def agent_overview(name: str) -> dict[str, Any] | None:
    return next((row for row in agents_overview() if row["name"] == name), None)


def paused_for_user(*, user: Actor) -> QuerySet[InputRequest]:
    """Pending pause requests (paused runs), longest paused first; for people who may
    continue runs (the permission that pauses them, ``cancel_run``)."""
    if not user.is_authenticated or not user.has_perm(VIEW) or not user.has_perm(CANCEL):
        return InputRequest.objects.none()
    return (
        InputRequest.objects.filter(status=RequestStatus.PENDING, kind=RequestKind.PAUSE)
        .select_related("run")
        .order_by("created_at", "id")
    )


def notifications_summary(request: InputRequest) -> list[dict[str, Any]]:
    """Who was told about ``request`` and when, by kind (pending, reminder, escalation):
    ``{kind, people, groups, first_at, escalated_to}`` for the messages actually sent."""
    from django.db.models import Count, Min, Q

    from runs.models import Notification

    rows = (
        Notification.objects.filter(request=request, status=Notification.Status.SENT)
        .values("kind")
        .annotate(
            people=Count("user", distinct=True),
            # The group webhooks only: an e-mail's ``group`` is blank (or, for an
            # escalation, the group its person was told as a member of).
            groups=Count("group", distinct=True, filter=Q(channel="webhook")),
            first_at=Min("sent_at"),
        )
        .order_by("first_at")
    )
    summary = []
    for row in rows:
        entry = dict(row)
        if row["kind"] == "escalation":
            entry["escalated_to"] = (
                Notification.objects.filter(request=request, kind="escalation")
                .exclude(group="")
                .values_list("group", flat=True)
                .first()
            )
        summary.append(entry)
    return summary


def answers_on_checkpoint(*, run_id: str, checkpoint_id: str, number: int) -> list[dict[str, Any]]:
    """The answers an attempt resuming from ``checkpoint_id`` may use (the matching rule of
    docs/agents.md, as ``runtime/selectors.answers_for`` applies it in process): the
    answered questions asked on that checkpoint since the last retry by a person, oldest
    answer first. The worker API hands them to remote workers with the lease."""
    from django.db.models import Max

    from runs.models import Attempt
    from runs.states import AttemptReason

    line_start = (
        Attempt.objects.filter(
            run_id=run_id, reason=AttemptReason.RETRY, number__lte=number
        ).aggregate(n=Max("number"))["n"]
        or 0
    )
    requests = (
        InputRequest.objects.filter(
            run_id=run_id,
            checkpoint_id=checkpoint_id,
            status=RequestStatus.ANSWERED,
            attempt__number__gte=line_start,
        )
        .select_related("answered_by")
        .order_by("answered_at")
    )
    return [
        {
            "request_id": request.id,
            "kind": request.kind,
            "step_id": request.step_id,
            "answer": request.answer,
            "answered_by": request.answered_by.get_username() if request.answered_by else None,
            "context": request.context or {},
            "action": request.action or {},
        }
        for request in requests
    ]
