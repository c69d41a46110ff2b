"""Reads that check permission. Views, APIs and consumers get runs and requests here.

A user without ``runs.view_run`` is an outsider: every run is "not found" for them,
so the existence of a run never leaks. A user who may see a run but not act on it
gets ``PermissionDenied`` (healthchecks ``_get_rw_check_for_user``).
"""

from __future__ import annotations

from typing import Any, TypedDict

from django.core.exceptions import PermissionDenied
from django.db.models import (
    BooleanField,
    Case,
    Exists,
    F,
    Func,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.http import Http404
from django.utils.translation import gettext, gettext_lazy

from runs import db
from runs.access import Actor
from runs.db import postgresql
from runs.models import AgentGate, Attempt, InputRequest, Run
from runs.states import RequestKind, RequestStatus, RunStatus

VIEW = "runs.view_run"
ANSWER = "runs.answer_run"
APPROVE = "runs.approve_run"
CANCEL = "runs.cancel_run"
RETRY = "runs.retry_run"
START = "runs.start_run"
PAUSE_AGENT = "runs.pause_agent"
VIEW_WORKERS = "runs.view_worker"
VIEW_AUDIT = "runs.view_audit"
# The operations page and GET /api/stats (runs/stats.py): who may see the workers sees it.
VIEW_OPERATIONS = VIEW_WORKERS
# The ledger's (ledger.models.ToolRule): confirm the rules of an agent's MCP gateway tools.
CHANGE_TOOL_RULES = "ledger.change_toolrule"


# What a person without a permission is told, in words (never the codename): who may.
# Every refusal of a missing permission says one of these (``permission_denied_text``).
PERMISSION_WORDS = {
    VIEW: gettext_lazy("Only people with access to runs can see this."),
    ANSWER: gettext_lazy("Only operators and approvers can answer questions."),
    APPROVE: gettext_lazy("Only approvers can approve or deny this."),
    CANCEL: gettext_lazy("Only operators and admins can cancel, pause or continue runs."),
    RETRY: gettext_lazy(
        "Only operators and admins can retry runs and reconcile or undo side effects."
    ),
    START: gettext_lazy("Only operators and admins can start runs."),
    PAUSE_AGENT: gettext_lazy("Only operators and admins can pause or unpause an agent."),
    VIEW_WORKERS: gettext_lazy("Only operators and admins can see the workers."),
    VIEW_AUDIT: gettext_lazy("Only admins can export the audit trail."),
    CHANGE_TOOL_RULES: gettext_lazy("Only admins can confirm the rules of an agent's tools."),
}


def permission_denied_text(perm: str) -> str:
    """Why a person may not do what needs ``perm`` ("runs.cancel_run"), in words."""
    found = PERMISSION_WORDS.get(perm)
    return str(found) if found is not None else gettext("You are not allowed to do this.")


def permission_for_request_kind(kind: str) -> str:
    """Answering a question and approving an action are different permissions; continuing
    a paused run takes the permission that paused it (``cancel_run``)."""
    if kind == RequestKind.PAUSE:
        return CANCEL
    return APPROVE if kind == RequestKind.AUTH_REQUIRED else ANSWER


def request_kind(*, run_id: str, request_id: str) -> str | None:
    """The kind of ``run_id``'s request ``request_id`` (None: no such request of this run),
    for the permission an answer needs before the service runs. A plain statement: every
    answer asks it (docs/performance.md)."""
    if postgresql():
        row = db.fetch_rows(
            "SELECT kind FROM runs_inputrequest WHERE id = %s AND run_id = %s",
            [request_id, run_id],
        )[0]
        return None if row is None else str(row[0])
    found: str | None = (
        InputRequest.objects.filter(pk=request_id, run_id=run_id)
        .values_list("kind", flat=True)
        .first()
    )
    return found


def run_get_for_user(
    *, user: Actor, run_id: str, perm: str | None = None, related: bool = False
) -> Run:
    """Return the run, or raise Http404 (no such run, or an outsider) / PermissionDenied.

    ``related``: with its current attempt and pending request loaded (in the same
    statement on PostgreSQL), as its representation shows them."""
    if not user.is_authenticated or not user.has_perm(VIEW):
        raise Http404("No such run.")
    run = _run_with_related(run_id) if related else db.get(Run, run_id)
    if run is None:
        raise Http404("No such run.")
    if perm is not None and not user.has_perm(perm):
        raise PermissionDenied(permission_denied_text(perm))
    return run


def _run_with_related(run_id: str) -> Run | None:
    if not postgresql():
        return (
            Run.objects.select_related(
                "current_attempt", "pending_request", "pending_request__answered_by"
            )
            .filter(pk=run_id)
            .first()
        )
    sql = (
        f"SELECT {db.columns(Run, 'r')}, {db.columns(Attempt, 'a')}, "  # noqa: S608 - names from the models
        f"{db.columns(InputRequest, 'q')} "
        f'FROM "{Run._meta.db_table}" r '
        f'LEFT JOIN "{Attempt._meta.db_table}" a ON a."id" = r."current_attempt_id" '
        f'LEFT JOIN "{InputRequest._meta.db_table}" q ON q."id" = r."pending_request_id" '
        'WHERE r."id" = %s'
    )
    found = db.fetch(Run, sql, [run_id])
    if found is None:
        return None
    run, rest = found
    attempt_values = rest[: db.width(Attempt)]
    request_values = rest[db.width(Attempt) :]
    if run.current_attempt_id is not None and attempt_values[0] is not None:
        run.current_attempt = db.build(Attempt, attempt_values)
    if run.pending_request_id is not None and request_values[0] is not None:
        run.pending_request = db.build(InputRequest, request_values)
    return run


def runs_for_user(
    *,
    user: Actor,
    status: str | None = None,
    agent: str | None = None,
    q: str | None = None,
    failure_class: str | None = None,
) -> QuerySet[Run]:
    if not user.is_authenticated or not user.has_perm(VIEW):
        return Run.objects.none()
    runs = Run.objects.all()
    if status:
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent=agent)
    if failure_class:
        # The operations page's failures link here (runs/stats.py).
        runs = runs.filter(failure_class=failure_class)
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
    """Pending requests, soonest expiry first. Paused runs have their own tab
    (``paused_for_user``); ``pauses`` includes them (API).

    ``mine_only`` ("Needs me"): what this person can act on now. Questions of the kinds
    they may answer; approvals they may approve under the request's policy and have not
    decided yet in this round (``approvals_for_person``). A ``Role`` (``pk`` None, a push
    shared by many people) gets the kinds only: it is nobody in particular.

    The inbox badge, the tab count, the browser's title count and the list all come from
    this one query (docs/dashboard.md).
    """
    if not user.is_authenticated or not user.has_perm(VIEW):
        return InputRequest.objects.none()
    requests = InputRequest.objects.filter(status=RequestStatus.PENDING)
    if mine_only:
        kinds = answerable_kinds(user)
        requests = requests.filter(kind__in=kinds)
        if RequestKind.AUTH_REQUIRED in kinds and user.pk is not None:
            requests = approvals_for_person(requests, user.pk)
    elif not pauses:
        requests = requests.exclude(kind=RequestKind.PAUSE)
    return requests.select_related("run").order_by("expires_at", "id")


def approvals_for_person(requests: QuerySet[InputRequest], pk: Any) -> QuerySet[InputRequest]:
    """``requests`` without the approvals the person ``pk`` cannot act on now, in the same
    statement (no query per request): the rules of ``runs.approvals.why_not_decide`` for an
    approval, in SQL.

    - They decided already in this round (a standing decision: ``ApprovalVote.standing``,
      the filter of ``runs.approvals.standing_votes``); an edit starts a new round, and
      then it waits for them again.
    - The policy names groups and they are in none (superusers too).
    - The policy forbids self-approval and they started the run or answered its last
      question before the approval was asked (``_last_answerer_id``).

    Everything else passes, questions included. A person kept out may still see the
    request under All pending, where the card says why.
    """
    from runs.models import ApprovalVote

    decided = ApprovalVote.objects.standing().filter(
        request=OuterRef("pk"), round=OuterRef("edit_round"), user_id=pk
    )
    last_answerer = Subquery(
        InputRequest.objects.filter(
            run_id=OuterRef("run_id"),
            kind=RequestKind.INPUT_REQUIRED,
            status=RequestStatus.ANSWERED,
            answered_at__lte=OuterRef("created_at"),
        )
        .order_by("-answered_at")
        .values("answered_by_id")[:1]
    )
    # Who started the run, as a scalar subquery (one primary-key lookup per request), not a
    # join: a join let the planner hash every run to count the pending requests (the nav
    # badge read a million runs at the growth benchmark's 1M; docs/performance.md).
    run_starter = Subquery(Run.objects.filter(pk=OuterRef("run_id")).values("created_by_id")[:1])
    # CASE … ELSE FALSE: a run nobody started, or no earlier answer, is never NULL here.
    barred_as_starter = Case(
        When(
            Q(policy__self_approval=False) & (Q(run_starter=pk) | Q(last_answerer=pk)),
            then=Value(True),
        ),
        default=Value(False),
        output_field=BooleanField(),
    )
    in_groups = _InPolicyGroups(F("policy"), pk)
    return requests.alias(
        run_starter=run_starter, last_answerer=last_answerer, barred_as_starter=barred_as_starter
    ).filter(
        ~Q(kind=RequestKind.AUTH_REQUIRED)
        | (~Exists(decided) & Q(barred_as_starter=False) & Q(in_groups))
    )


def judged_per_person_q() -> Q:
    """The approvals that "Needs me" (``approvals_for_person``) and the card may answer
    differently for two people with the same permissions: a decision was recorded, or the
    policy names groups or forbids self-approval. For every other request a push may count
    and render once for everyone with the same permissions (``live/consumers.py``)."""
    return Q(kind=RequestKind.AUTH_REQUIRED, status=RequestStatus.PENDING) & (
        Q(decisions__gt=0) | Q(policy__self_approval=False) | Q(policy__groups__0__isnull=False)
    )


def judged_per_person(request: InputRequest) -> bool:
    """``judged_per_person_q`` for one request already read."""
    policy = request.policy if isinstance(request.policy, dict) else {}
    return (
        request.kind == RequestKind.AUTH_REQUIRED
        and request.status == RequestStatus.PENDING
        and (
            request.decisions > 0
            or policy.get("self_approval") is False
            or bool(policy.get("groups"))
        )
    )


class _InPolicyGroups(Func):
    """True when the request's policy (the one expression) names no groups, or the person
    ``pk`` is a member of one of them; never NULL. JSON arrays have no portable SQL, so
    one statement per database. The policy is compiled as a column, so the condition
    still holds when Django relabels the query (a subquery)."""

    output_field = BooleanField()

    def __init__(self, policy: Any, pk: Any) -> None:
        super().__init__(policy)
        self.pk = pk

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:  # type: ignore[override]
        from django.contrib.auth import get_user_model
        from django.contrib.auth.models import Group

        policy, params = compiler.compile(self.source_expressions[0])
        qn = connection.ops.quote_name
        groups_field: Any = get_user_model()._meta.get_field("groups")
        through = qn(groups_field.remote_field.through._meta.db_table)
        member = qn(groups_field.m2m_column_name())
        group = qn(groups_field.m2m_reverse_name())
        group_table = qn(Group._meta.db_table)
        if postgresql():
            groups = f"{policy} -> 'groups'"
            names = f"(CASE WHEN jsonb_typeof({groups}) = 'array' THEN {groups} END)"
            sql = (
                f"(COALESCE(jsonb_array_length({names}), 0) = 0 OR EXISTS (SELECT 1 FROM "  # noqa: S608 - names from the models
                f"{through} hp_m JOIN {group_table} hp_g ON hp_g.id = hp_m.{group} "
                f"WHERE hp_m.{member} = %s AND {names} @> jsonb_build_array(hp_g.name)))"
            )
            # The policy's column four times (two in each ``names``), the person once.
            return sql, [*params, *params, self.pk, *params, *params]
        sql = (
            f"(COALESCE(json_array_length({policy}, '$.groups'), 0) = 0 OR EXISTS (SELECT 1 "  # noqa: S608 - names from the models
            f"FROM json_each({policy}, '$.groups') hp_j JOIN {group_table} hp_g ON "
            f"hp_g.name = hp_j.value JOIN {through} hp_m ON hp_m.{group} = hp_g.id "
            f"WHERE hp_m.{member} = %s))"
        )
        return sql, [*params, *params, self.pk]


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


class AnswerRecord(TypedDict):
    """A person's answer as a resumed step receives it (in process or in a lease)."""

    request_id: str
    kind: str
    step_id: str
    answer: Any
    answered_by: str | None
    context: dict[str, Any]
    action: dict[str, Any]


def answers_for_lease(lease: Any) -> list[AnswerRecord]:
    """The answers the first step of an attempt may use, oldest answer first: the one rule
    of docs/agents.md ("the matching rule"), for the in-process runtime
    (``runtime/selectors.py``) and the worker API's lease alike.

    An answer belongs to the checkpoint its question was asked on. A step that runs from
    checkpoint C gets the answers to the questions asked on C (the one the attempt resumes
    with, and any answered earlier on C by the same step) asked since the last retry by a
    person: a retry asks again. The request the attempt resumes with (``resume_request``,
    handed on to a next attempt of the same step) is always among them."""
    from django.db.models import Max

    from runs.models import Attempt
    from runs.states import AttemptReason

    if not lease.resume_from:
        return []
    line_start = (
        Attempt.objects.filter(
            run_id=lease.run_id, reason=AttemptReason.RETRY, number__lte=lease.number
        ).aggregate(n=Max("number"))["n"]
        or 0
    )
    requests = (
        InputRequest.objects.filter(
            run_id=lease.run_id,
            checkpoint_id=lease.resume_from["checkpoint_id"],
            status=RequestStatus.ANSWERED,
            attempt__number__gte=line_start,
        )
        .select_related("answered_by")
        .order_by("answered_at")
    )
    answers: list[AnswerRecord] = [
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
    resumed = lease.resume_request
    if (
        resumed
        and resumed.get("step_id")
        and not any(a["request_id"] == resumed["request_id"] for a in answers)
    ):
        answers.append(
            {
                "request_id": resumed["request_id"],
                "kind": resumed["kind"],
                "step_id": resumed["step_id"],
                "answer": resumed.get("answer"),
                "answered_by": resumed.get("answered_by"),
                "context": {},
                "action": resumed.get("action") or {},
            }
        )
    return answers


# --- Why a queued run is not running --------------------------------------------------------

# The statuses in which a run waits for a worker to claim it.
WAITS_FOR_WORKER = (RunStatus.QUEUED, RunStatus.WAITING)


class WaitingReason:
    """The stable codes of ``waiting.reason`` (docs/api.md), first that applies wins."""

    AGENT_PAUSED = "agent_paused"  # its agent's gate is shut: held until someone unpauses
    BACKING_OFF = "backing_off"  # a retry's backoff: not due until ``until``
    NO_WORKER = "no_worker"  # no live worker serves its agent (since: the last one's contact)
    READY = "ready"  # due, and a live worker serves its agent: claimed when one is free


def waiting_for_runs(runs: Any, *, now: Any = None) -> dict[str, dict[str, Any] | None]:
    """Why each of ``runs`` that waits to be claimed (queued, or backing off) is not
    running, by run id; None for every other run. The one home of this rule: the API's
    ``waiting`` field, the run page, the runs list and their live pushes read it.

    ``{reason, agent, since, until, by, detail, workers}``: ``agent_paused`` (``by`` who,
    ``detail`` why, ``since`` when), ``backing_off`` (``until``), ``no_worker`` (``since``:
    the last contact of the last worker that served the agent, null when none ever did;
    ``by``: that worker's name), ``ready`` (``workers``: how many live workers serve it).
    Two queries for any number of runs (the gates and the workers), none when no run waits.
    """
    from django.utils import timezone

    from runs.models import Worker
    from runs.workers import MAX_LISTED, serves, state_at

    runs = list(runs)
    answer: dict[str, dict[str, Any] | None] = {run.id: None for run in runs}
    queued = [run for run in runs if run.status in WAITS_FOR_WORKER]
    if not queued:
        return answer
    now = now or timezone.now()
    agents = {run.agent for run in queued}
    gates = {
        gate.agent: gate
        for gate in AgentGate.objects.filter(agent__in=agents, paused=True).select_related(
            "paused_by"
        )
    }
    workers = list(
        Worker.objects.order_by("-last_seen_at", "pk").only(
            "name", "agents", "last_seen_at", "stale_at", "gone_at", "stopped_at"
        )[: MAX_LISTED * 5]
    )
    for run in queued:
        serving = [w for w in workers if serves(w, run.agent)]
        live = [w for w in serving if state_at(w, now) == Worker.State.ALIVE]
        last = serving[0] if serving else None  # newest contact first
        waiting: dict[str, Any] = {
            "reason": WaitingReason.READY,
            "agent": run.agent,
            "since": None,
            "until": None,
            "by": None,
            "detail": "",
            "workers": len(live),
        }
        gate = gates.get(run.agent)
        if gate is not None:
            who = gate.paused_by.get_username() if gate.paused_by else gate.actor
            waiting.update(
                reason=WaitingReason.AGENT_PAUSED,
                since=gate.paused_at,
                by=who.removeprefix("user:"),
                detail=gate.reason,
            )
        elif run.status == RunStatus.WAITING or (run.not_before and run.not_before > now):
            waiting.update(reason=WaitingReason.BACKING_OFF, until=run.not_before)
        elif not live:
            waiting.update(
                reason=WaitingReason.NO_WORKER,
                since=last.last_seen_at if last else None,
                by=last.name if last else None,
            )
        answer[run.id] = waiting
    return answer


def run_waiting(run: Run) -> dict[str, Any] | None:
    """``waiting_for_runs`` of one run."""
    return waiting_for_runs([run])[run.id]
