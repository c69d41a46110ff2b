"""Services a run goes through while it works: start, claim, heartbeat, checkpoint,
interrupt, complete, fail, release.

Worker writes are fenced (``lock_for_worker_write``); every change appends its
event in the same transaction. Top-level services are ``durable`` so that their
on-commit signals run when they return (Zulip's rule).
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypedDict

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from runs import db
from runs.agents import agent_spec, approval_policy_for
from runs.approvals import check_editable, preapproval_stands, why_not_preapprove
from runs.db import db_now, postgresql, row_now, with_db_now
from runs.errors import HoldpointError
from runs.events import EventType, append_event, batched_events, how, work_notice
from runs.idempotency import joinable
from runs.models import Attempt, Checkpoint, InputRequest, Run, RunEvent, claimable_q
from runs.schemas import APPROVAL_SCHEMA, compile_schema, too_deep, validate_value
from runs.selectors import APPROVE
from runs.services._base import (
    UserLike,
    actor_for,
    clear_pause_request,
    gate_closed,
    lease_seconds_or_default,
    lock_for_worker_write,
    measured,
    parse_cost,
    pause_as_requested,
    pause_locked,
    queue_attempt,
    renew_lease,
    run_gate_closed,
    set_attempt_cost,
    user_or_none,
    write_run,
)
from runs.services.approvals import approval_action, policy_for_request
from runs.services.notifications import outbox_for_request
from runs.states import (
    AttemptReason,
    AttemptStatus,
    FailureClass,
    RequestKind,
    RunStatus,
    next_status,
)
from runs.tokens import Serving


class ResumeFrom(TypedDict):
    """The checkpoint an attempt resumes from: run ``step`` from ``state``."""

    checkpoint_id: str
    step: str
    state: Any
    number: int


class ResumeRequest(TypedDict):
    """The answered request an attempt must use (``runs.services._base.queue_attempt``)."""

    request_id: str
    kind: str
    step_id: str
    answer: Any
    answered_by: str | None
    action: dict[str, Any] | None


@dataclass(frozen=True)
class Lease:
    """What a worker is given at claim time; every later write carries its two epochs."""

    attempt_id: str
    run_id: str
    agent: str
    number: int
    reason: str
    worker_id: str
    lease_epoch: int
    cancel_epoch: int
    lease_seconds: float
    lease_expires_at: dt.datetime
    input: Any
    approvals: list[str]
    resume_from: ResumeFrom | None
    resume_request: ResumeRequest | None
    # Breakpoints: the runtime pauses at the boundary before each of these steps.
    pause_before: list[str]
    # Read off the run row the claim locked, so no one reads the run again for them: what
    # the run's earlier attempts cost, and the declared agent's version it started with.
    run_cost: Decimal = Decimal(0)
    agent_version: int | None = None


@dataclass(frozen=True)
class Heartbeat:
    lease_expires_at: dt.datetime
    cancel_requested: bool
    # Stop at the next step boundary: the run was paused, or its agent's gate closed.
    pause_requested: bool = False
    # The database's clock when the lease was renewed: what is left of the lease is
    # lease_expires_at - renewed_at, without asking the clock again.
    renewed_at: dt.datetime | None = None


def _pause_requested(run: Run) -> bool:
    # The gate is read only when it matters (a running run): run_gate_closed may query.
    gate = run.status == RunStatus.RUNNING and run_gate_closed(run)
    return _signals(
        status=run.status, run_cancel_epoch=0, attempt_cancel_epoch=0, gate_closed=gate
    )[1]


@measured("start")
@joinable
def run_start(
    *,
    agent: str,
    input: Any,
    user: UserLike = None,
    actor: str | None = None,
    approvals: list[str] | None = None,
    pause_before: list[str] | None = None,
    via: str = "",
    identity: str = "",
) -> Run:
    """Create a run of a known agent with a validated input and queue its first attempt.

    ``approvals`` names steps approved now, at start. Giving them is the starter's own
    vote on their own run, so it needs a person holding ``runs.approve_run`` whom the
    agent's approval policy lets approve alone and approve their own run
    (``runs.approvals.why_not_preapprove``): anyone else is refused
    ``preapproval_not_permitted`` with the reason, and nothing is created. The approval
    is recorded as that person's (event ``run.approved_at_start``; the ledger names them
    as the approver of what the step then does). ``pause_before`` names steps before
    which the run pauses every time it reaches them. ``via`` and ``identity``: how it
    was started (``runs/audit.py``), on ``run.created`` and ``run.approved_at_start``.
    """
    door = how(via=via, identity=identity)
    spec = agent_spec(agent)
    if spec.input_schema:
        validate_value(compile_schema(spec.input_schema), input, what="input")
    steps = _preapproved_steps(approvals)
    approver = user_or_none(user)
    if steps and (approver is None or not approver.has_perm(APPROVE)):
        raise HoldpointError(
            "preapproval_not_permitted",
            "Approving steps when a run starts is an approval: it needs the approve "
            "permission. Start the run without approvals, or ask an approver to start it.",
            approvals=steps,
            reason="no_permission",
        )
    if steps:
        why = why_not_preapprove(approval_policy_for(spec.name)[0], approver)
        if why is not None:
            raise HoldpointError(
                "preapproval_not_permitted", why.detail, approvals=steps, reason=why.reason
            )
    if pause_before is not None and (
        not isinstance(pause_before, list)
        or len(pause_before) > 100
        or not all(isinstance(p, str) and 0 < len(p) <= 100 for p in pause_before)
    ):
        raise HoldpointError(
            "invalid_input",
            "pause_before must be a list of at most 100 step names (1 to 100 characters).",
            errors=[{"pointer": "/pause_before", "message": "a list of step names"}],
        )
    run = Run(
        agent=spec.name,
        agent_version=spec.version,
        input=input,
        approvals=steps,
        pause_before=list(dict.fromkeys(pause_before or [])),
        status=RunStatus.QUEUED,
        created_by=approver,
    )
    actor = actor or actor_for(user)
    approved_by = approver.get_username() if steps else None
    created: dict[str, Any] = {
        "agent": spec.name,
        "approvals": run.approvals,
        "approved_by": approved_by,
        **door,
    }
    if run.pause_before:
        created["pause_before"] = run.pause_before
    with batched_events(run):
        append_event(run, EventType.RUN_CREATED, actor, created)
        if steps:
            append_event(
                run,
                EventType.RUN_APPROVED_AT_START,
                actor_for(user),
                {"steps": steps, "by": approved_by, **door},
            )
        attempt = queue_attempt(
            run,
            reason=AttemptReason.INITIAL,
            resume_from=None,
            not_before=db_now(),
            written_later=True,
            number=1,
        )
        # The run, its first attempt, its events and the workers' wake-up in one statement.
        write_run(run, new=True, inserts=[attempt], notify=work_notice(run.agent))
    return run


MAX_PREAPPROVALS = 100


def _preapproved_steps(approvals: Any) -> list[str]:
    """The step ids approved at start: 1 to 100 characters each, at most 100, no repeats."""
    if approvals is None:
        return []
    if (
        not isinstance(approvals, list | tuple)
        or len(approvals) > MAX_PREAPPROVALS
        or not all(isinstance(a, str) and 0 < len(a) <= 100 for a in approvals)
    ):
        raise HoldpointError(
            "invalid_input",
            f"approvals must be a list of at most {MAX_PREAPPROVALS} step ids "
            "(1 to 100 characters each).",
        )
    return list(dict.fromkeys(approvals))


def _lease_for(run: Run, attempt: Attempt, lease_seconds: float) -> Lease:
    resume_from: ResumeFrom | None = None
    if attempt.resume_from_id:
        checkpoint = Checkpoint.objects.get(pk=attempt.resume_from_id)
        resume_from = {
            "checkpoint_id": checkpoint.id,
            "step": checkpoint.step,
            "state": checkpoint.state,
            "number": checkpoint.number,
        }
    resume_request: ResumeRequest | None = None
    if attempt.resume_request_id:
        request = InputRequest.objects.select_related("answered_by").get(
            pk=attempt.resume_request_id
        )
        resume_request = {
            "request_id": request.id,
            "kind": request.kind,
            "step_id": request.step_id,
            "answer": request.answer,
            "answered_by": request.answered_by.get_username() if request.answered_by else None,
            "action": request.action or None,
        }
    assert attempt.lease_expires_at is not None
    return Lease(
        attempt_id=attempt.id,
        run_id=run.id,
        agent=run.agent,
        number=attempt.number,
        reason=attempt.reason,
        worker_id=attempt.worker_id,
        lease_epoch=run.lease_epoch,
        cancel_epoch=run.cancel_epoch,
        lease_seconds=lease_seconds,
        lease_expires_at=attempt.lease_expires_at,
        input=run.input,
        # Judged again now: a policy made stricter since the start takes them back.
        approvals=list(run.approvals) if preapproval_stands(run) else [],
        resume_from=resume_from,
        resume_request=resume_request,
        pause_before=list(run.pause_before or []),
        run_cost=run.cost or Decimal(0),
        agent_version=run.agent_version,
    )


_CLAIMED_ATTEMPT_FIELDS = [
    "status",
    "worker_id",
    "worker_token",
    "lease_epoch",
    "cancel_epoch",
    "lease_expires_at",
    "last_heartbeat_at",
    "started_at",
]


# The worker's events name it "worker:<worker_id>" in RunEvent.actor (200 characters).
WORKER_ID_MAX_LENGTH = 200 - len("worker:")


def _claimable(
    due: Any, agents: tuple[str, ...], allowed: tuple[str, ...] | None, excluded: tuple[str, ...]
) -> QuerySet[Run]:
    """The claim's query: the next due run, locked, skipping runs other claims hold.

    SKIP LOCKED: concurrent claimers each take a different run instead of queueing behind
    one another; the partial index run_claimable_idx serves this query. The clock is read in
    the same statement (``due`` is ``Now()`` on PostgreSQL): "due" and the lease's start are
    one instant. The agent gate is part of the claimable rule, in the claim's own SQL (NOT
    EXISTS a closed gate of the run's agent): a paused agent's runs are never claimed and
    never block other agents'."""
    candidates = with_db_now(
        Run.objects.select_for_update(skip_locked=True, of=("self",)).filter(claimable_q(due))
    )
    if agents:
        candidates = candidates.filter(agent__in=agents)
    if allowed is not None:
        candidates = candidates.filter(agent__in=allowed)
    if excluded:
        candidates = candidates.exclude(agent__in=excluded)
    return candidates.order_by("not_before")[:1]


@functools.lru_cache(maxsize=256)
def _claim_sql(
    agents: tuple[str, ...], allowed: tuple[str, ...] | None, excluded: tuple[str, ...]
) -> tuple[str, tuple[Any, ...]]:
    """``_claimable``'s SQL on PostgreSQL, compiled once per shape of claim: compiling the
    queryset cost more CPU than PostgreSQL spends answering it (docs/performance.md, the
    worker cycle). Its columns are the run's, then the clock (``db.fetch`` reads them)."""
    sql, params = _claimable(Now(), agents, allowed, excluded).query.sql_with_params()
    return sql, tuple(params)


@transaction.atomic(durable=True)
def attempt_claim(
    *,
    worker_id: str,
    agents: list[str] | None = None,
    lease_seconds: float | None = None,
    worker_token_id: int | None = None,
    serving: Serving | None = None,
) -> Lease | None:
    """Lease the next due attempt to ``worker_id``. Return the lease, or None when no work is ready.

    ``serving``: what the claiming worker token may serve (``runs.tokens.serving_for``):
    its scope, never a declared agent that other tokens own."""
    if not worker_id or len(worker_id) > WORKER_ID_MAX_LENGTH:
        raise HoldpointError(
            "invalid_input", f"worker_id must be 1 to {WORKER_ID_MAX_LENGTH} characters."
        )
    seconds = lease_seconds_or_default(lease_seconds)
    allowed = None if serving is None else serving.allowed
    excluded = () if serving is None else tuple(sorted(serving.excluded))
    due: Any
    if postgresql():
        due = None  # the statement reads the clock itself
        found = db.fetch(Run, *_claim_sql(tuple(agents or ()), allowed, excluded))
        run = None
        if found is not None:
            run, (run.db_now,) = found  # type: ignore[attr-defined]
    else:
        due = timezone.now()
        run = _claimable(due, tuple(agents or ()), allowed, excluded).first()
    if run is None:
        return None
    if postgresql():
        # The NOT EXISTS above read the gate as of this statement's start; a pause that
        # committed since would not be seen. FOR SHARE reads the latest gate and waits for
        # a pause in flight (agent_pause holds the row FOR UPDATE), so a claim either
        # commits before the pause (which then tells its worker) or sees the gate closed.
        # The queued attempt comes back in the same round trip.
        gate, attempt_row = db.fetch_rows(
            "SELECT paused FROM runs_agentgate WHERE agent = %s FOR SHARE; "  # noqa: S608 - names from the models
            + db.row_sql(Attempt),
            [run.agent, run.current_attempt_id],
        )
        if gate is not None and gate[0]:
            return None
        attempt = None if attempt_row is None else db.build(Attempt, attempt_row)
    else:
        attempt = db.get(Attempt, run.current_attempt_id)
    now = due if due is not None else row_now(run)
    assert attempt is not None  # a claimable run has its queued attempt
    previous = run.status
    run.status = next_status(run.status, "claim")
    run.lease_epoch += 1
    run.not_before = None
    attempt.status = AttemptStatus.RUNNING
    attempt.worker_id = worker_id
    # Bound to the claiming token: the fence refuses writes to it from any other token.
    attempt.worker_token_id = worker_token_id
    attempt.lease_epoch = run.lease_epoch
    attempt.cancel_epoch = run.cancel_epoch
    attempt.lease_expires_at = now + dt.timedelta(seconds=seconds)
    attempt.last_heartbeat_at = now
    attempt.started_at = now
    with batched_events(run):
        append_event(
            run,
            EventType.ATTEMPT_CLAIMED,
            f"worker:{worker_id}",
            {
                "attempt_id": attempt.id,
                "number": attempt.number,
                "from_status": previous,
                "lease_epoch": run.lease_epoch,
                "cancel_epoch": run.cancel_epoch,
                "lease_expires_at": attempt.lease_expires_at.isoformat(),
            },
        )
        # The attempt, its event and the run in one statement.
        write_run(
            run,
            fields=["status", "lease_epoch", "not_before", "last_event_seq", "updated_at"],
            attempt=attempt,
            attempt_fields=_CLAIMED_ATTEMPT_FIELDS,
        )
    return _lease_for(run, attempt, seconds)


def _signals(
    *, status: str, run_cancel_epoch: int, attempt_cancel_epoch: int | None, gate_closed: bool
) -> tuple[bool, bool]:
    """(cancel_requested, pause_requested) as a renewal answers them."""
    cancel = status == RunStatus.CANCEL_REQUESTED or run_cancel_epoch != attempt_cancel_epoch
    pause = status == RunStatus.PAUSE_REQUESTED or (status == RunStatus.RUNNING and gate_closed)
    return cancel, pause


def attempt_heartbeat(
    *,
    attempt_id: str,
    lease_epoch: int,
    lease_seconds: float | None = None,
    cost: Any = None,
    worker_token_id: int | None = None,
) -> Heartbeat:
    """Renew the lease. Fenced by ``lease_epoch`` only: a cancelled run's worker still renews,
    learns ``cancel_requested`` and acknowledges with ``attempt_release``.

    Without a cost to record, on PostgreSQL, the renewal is one statement (``renew_lease``:
    the run lock, the fence and the write); a refusal, a cost, or SQLite take the locked
    path below, which answers the refusal's exact code."""
    seconds = lease_seconds_or_default(lease_seconds)
    if cost is None:
        renewed = renew_lease(
            attempt_id=attempt_id,
            lease_epoch=lease_epoch,
            seconds=seconds,
            worker_token_id=worker_token_id,
        )
        if renewed is not None:
            cancel, pause = _signals(
                status=renewed.run_status,
                run_cancel_epoch=renewed.run_cancel_epoch,
                attempt_cancel_epoch=renewed.attempt_cancel_epoch,
                gate_closed=renewed.gate_closed,
            )
            return Heartbeat(
                lease_expires_at=renewed.lease_expires_at,
                cancel_requested=cancel,
                pause_requested=pause,
                renewed_at=renewed.renewed_at,
            )
    return _heartbeat_locked(
        attempt_id=attempt_id,
        lease_epoch=lease_epoch,
        seconds=seconds,
        cost=cost,
        worker_token_id=worker_token_id,
    )


@joinable
def _heartbeat_locked(
    *,
    attempt_id: str,
    lease_epoch: int,
    seconds: float,
    cost: Any,
    worker_token_id: int | None,
) -> Heartbeat:
    parsed_cost = parse_cost(cost)
    fenced = lock_for_worker_write(
        attempt_id=attempt_id,
        lease_epoch=lease_epoch,
        cancel_epoch=None,
        worker_token_id=worker_token_id,
    )
    run, attempt, now = fenced.run, fenced.attempt, fenced.now
    attempt.lease_expires_at = now + dt.timedelta(seconds=seconds)
    attempt.last_heartbeat_at = now
    set_attempt_cost(run, attempt, parsed_cost)
    attempt.save(update_fields=["lease_expires_at", "last_heartbeat_at", "cost"])
    if parsed_cost is not None:
        run.save(update_fields=["cost", "updated_at"])
    cancel, pause = _signals(
        status=run.status,
        run_cancel_epoch=run.cancel_epoch,
        attempt_cancel_epoch=attempt.cancel_epoch,
        gate_closed=run_gate_closed(run),
    )
    return Heartbeat(
        lease_expires_at=attempt.lease_expires_at,
        cancel_requested=cancel,
        pause_requested=pause,
        renewed_at=now,
    )


# How many attempts one batch renewal may name: a worker process with more runs more batches.
MAX_HEARTBEAT_BATCH = 100


def attempts_heartbeat(
    *,
    beats: list[tuple[str, int, Any]],
    lease_seconds: float | None = None,
    worker_token_id: int | None = None,
) -> list[Heartbeat | HoldpointError]:
    """Renew the leases of several attempts of one worker: ``beats`` is a list of
    (attempt_id, lease_epoch, cost). Each is fenced on its own, exactly as
    ``attempt_heartbeat`` fences one, and committed on its own: a refused one (its
    ``HoldpointError`` in its place in the answer) changes nothing and holds no other back."""
    if len(beats) > MAX_HEARTBEAT_BATCH:
        raise HoldpointError(
            "invalid_input", f"A batch renews at most {MAX_HEARTBEAT_BATCH} attempts."
        )
    lease_seconds_or_default(lease_seconds)  # refused for all before any is renewed
    answers: list[Heartbeat | HoldpointError] = []
    for attempt_id, lease_epoch, cost in beats:
        try:
            answers.append(
                attempt_heartbeat(
                    attempt_id=attempt_id,
                    lease_epoch=lease_epoch,
                    lease_seconds=lease_seconds,
                    cost=cost,
                    worker_token_id=worker_token_id,
                )
            )
        except HoldpointError as exc:
            answers.append(exc)
    return answers


@transaction.atomic(durable=True)
def attempt_release(
    *, attempt_id: str, lease_epoch: int, reason: str, worker_token_id: int | None = None
) -> Run:
    """Give the lease back: ``cancelled`` acknowledges a cancel, ``shutdown`` hands the
    attempt to another worker from the latest checkpoint at once, ``paused`` stops at a
    step boundary because the run was paused (it holds a pause request on its latest
    checkpoint) or its agent's gate closed (it waits ``queued``, held).

    A cancel wins over everything; a pause requested before a shutdown release still
    pauses the run (nobody must continue it by accident)."""
    if reason not in {"cancelled", "shutdown", "paused"}:
        raise HoldpointError("invalid_input", "reason must be 'cancelled', 'shutdown' or 'paused'.")
    fenced = lock_for_worker_write(
        attempt_id=attempt_id,
        lease_epoch=lease_epoch,
        cancel_epoch=None,
        worker_token_id=worker_token_id,
    )
    run, attempt, now = fenced.run, fenced.attempt, fenced.now
    worker = f"worker:{attempt.worker_id}"
    attempt.status = AttemptStatus.ABORTED
    attempt.ended_at = now
    attempt.lease_expires_at = None
    attempt.error_message = f"released: {reason}"
    if run.status == RunStatus.CANCEL_REQUESTED:
        attempt.save()
        _finish_cancel(run, now=now, actor=worker)
    elif reason == "cancelled":
        raise HoldpointError(
            "invalid_state", "The run has no cancel pending; release with reason 'shutdown'."
        )
    elif run.status == RunStatus.PAUSE_REQUESTED:
        # An interrupt: the attempt ends as a hold point's does, the run holds a request.
        attempt.status = AttemptStatus.INTERRUPTED
        attempt.save()
        pause_as_requested(run, attempt, now=now, actor=worker)
    elif reason == "paused":
        # The agent's gate closed (or closed and reopened since the worker heard of it):
        # the run waits queued from its latest checkpoint; claims skip it while it is shut.
        attempt.save()
        run.status = next_status(run.status, "hold")
        attempt_new = queue_attempt(
            run, reason=AttemptReason.HELD, resume_from=run.latest_checkpoint, not_before=now
        )
        append_event(
            run,
            EventType.RUN_HELD,
            worker,
            {
                "attempt_id": attempt.id,
                "next_attempt_id": attempt_new.id,
                "checkpoint_id": run.latest_checkpoint_id,
                "gate_closed": gate_closed(run.agent),
            },
        )
    else:
        attempt.save()
        run.status = next_status(run.status, "release_shutdown")
        attempt_new = queue_attempt(
            run,
            reason=AttemptReason.RELEASED,
            resume_from=run.latest_checkpoint,
            not_before=now,
        )
        append_event(
            run,
            EventType.ATTEMPT_RELEASED,
            worker,
            {"attempt_id": attempt.id, "reason": reason, "next_attempt_id": attempt_new.id},
        )
    run.save()
    return run


def _finish_cancel(run: Run, *, now: Any, actor: str) -> None:
    """The worker has stopped (or its lease is gone): the cancel becomes final."""
    run.status = next_status(run.status, "cancel_done")
    clear_pause_request(run)
    run.failure_class = FailureClass.CANCELLED
    run.finished_at = now
    run.not_before = None
    append_event(run, EventType.RUN_CANCELLED, actor, {"cancel_epoch": run.cancel_epoch})


@joinable
def checkpoint_save(
    *,
    attempt_id: str,
    lease_epoch: int,
    cancel_epoch: int,
    step: str,
    state: Any,
    cost: Any = None,
    worker_token_id: int | None = None,
) -> Checkpoint:
    """Save an immutable snapshot of agent state; ``step`` names the step to run next."""
    if not isinstance(step, str) or not step or len(step) > 100:
        raise HoldpointError("invalid_input", "step must be 1 to 100 characters.")
    parsed_cost = parse_cost(cost)
    fenced = lock_for_worker_write(
        attempt_id=attempt_id,
        lease_epoch=lease_epoch,
        cancel_epoch=cancel_epoch,
        worker_token_id=worker_token_id,
        next_checkpoint_number=True,
    )
    run, attempt = fenced.run, fenced.attempt
    number = fenced.checkpoint_number
    assert number is not None
    checkpoint = Checkpoint(run=run, attempt=attempt, number=number, step=step, state=state)
    run.latest_checkpoint = checkpoint
    # The boundary itself says whether to stop here, so a worker that missed the signal
    # (it claimed just before the agent's gate closed) stops at its first boundary.
    checkpoint.pause_requested = _pause_requested(run)
    run_fields = ["latest_checkpoint", "last_event_seq", "updated_at"]
    cost_changed = set_attempt_cost(run, attempt, parsed_cost)
    if cost_changed:
        run_fields.append("cost")
    with batched_events(run):
        append_event(
            run,
            EventType.CHECKPOINT_SAVED,
            f"worker:{attempt.worker_id}",
            {
                "checkpoint_id": checkpoint.id,
                "number": number,
                "step": step,
                "attempt_id": attempt.id,
            },
        )
        # The checkpoint, its event, the attempt's cost and the run in one statement.
        write_run(
            run,
            fields=run_fields,
            attempt=attempt if cost_changed else None,
            attempt_fields=["cost"],
            inserts=[checkpoint],
        )
    return checkpoint


def _expires_at(expires_in: Any, expires_at: Any) -> dt.datetime:
    # The person's clock: how long someone has to answer is a separate setting from the lease.
    now = timezone.now()
    if expires_at is not None and expires_in is not None:
        raise HoldpointError("invalid_input", "Give expires_in or expires_at, not both.")
    if expires_at is not None:
        if isinstance(expires_at, str):
            from django.utils.dateparse import parse_datetime

            parsed = parse_datetime(expires_at)
            if parsed is None or parsed.tzinfo is None:
                raise HoldpointError(
                    "invalid_input", "expires_at must be an ISO 8601 time with a zone."
                )
            expires_at = parsed
        if not isinstance(expires_at, dt.datetime) or expires_at <= now:
            raise HoldpointError("invalid_input", "expires_at must be in the future.")
        return expires_at
    seconds = settings.HOLDPOINT_INPUT_EXPIRES_SECONDS if expires_in is None else expires_in
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not 1 <= seconds <= 90 * 86400
    ):
        raise HoldpointError("invalid_input", "expires_in must be 1 second to 90 days.")
    return now + dt.timedelta(seconds=seconds)


@joinable
def attempt_interrupt(
    *,
    attempt_id: str,
    lease_epoch: int,
    cancel_epoch: int,
    checkpoint_id: str,
    kind: str,
    prompt: str,
    accepted_schema: Any = None,
    expires_in: Any = None,
    expires_at: Any = None,
    context: Any = None,
    reason: str = "",
    step_id: str = "",
    action: Any = None,
    cost: Any = None,
    worker_token_id: int | None = None,
) -> InputRequest:
    """Stop at a hold point: persist the question on the checkpoint it was asked on, release
    the worker. The attempt ends ``interrupted``; resume continues in a new attempt.

    Kind ``pause`` is a breakpoint: the runtime stops before the step ``context.breakpoint``
    (the run's ``pause_before``) with ``prompt`` as the reason, and continuing takes no value.
    """
    if kind not in RequestKind.values:
        raise HoldpointError(
            "invalid_input", "kind must be input_required, auth_required or pause."
        )
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > 10_000:
        raise HoldpointError("invalid_input", "prompt must be 1 to 10,000 characters.")
    if kind == RequestKind.PAUSE:
        return _breakpoint(
            attempt_id=attempt_id,
            lease_epoch=lease_epoch,
            cancel_epoch=cancel_epoch,
            checkpoint_id=checkpoint_id,
            reason=prompt,
            context=context,
            cost=cost,
        )
    if kind == RequestKind.AUTH_REQUIRED:
        # An approval always takes {decision, comment}; the agent does not choose the form.
        schema = APPROVAL_SCHEMA
        if not isinstance(action, dict) or not action.get("tool"):
            raise HoldpointError(
                "invalid_input", "An approval needs an action with at least its tool."
            )
        if "editable" in action:
            action = {**action, "editable": check_editable(action["editable"])}
    else:
        schema = compile_schema(accepted_schema)
    if context is not None and not isinstance(context, dict):
        raise HoldpointError("invalid_input", "context must be a JSON object.")
    deadline = _expires_at(expires_in, expires_at)
    parsed_cost = parse_cost(cost)
    fenced = lock_for_worker_write(
        attempt_id=attempt_id,
        lease_epoch=lease_epoch,
        cancel_epoch=cancel_epoch,
        worker_token_id=worker_token_id,
    )
    run, attempt, now = fenced.run, fenced.attempt, fenced.now
    if run.latest_checkpoint_id != checkpoint_id:
        raise HoldpointError(
            "stale_checkpoint",
            "A hold point must be on the run's latest checkpoint.",
            latest_checkpoint_id=run.latest_checkpoint_id,
        )
    if kind == RequestKind.AUTH_REQUIRED:
        # The tool's reversibility and request schema, as the server knows them.
        action = approval_action(run.agent, action)
    request = InputRequest.objects.create(
        run=run,
        attempt=attempt,
        checkpoint_id=checkpoint_id,
        kind=kind,
        step_id=step_id or "",
        reason=reason or "",
        prompt=prompt,
        accepted_schema=schema,
        context=context or {},
        action=action or {},
        policy=policy_for_request(run.agent, action) if kind == RequestKind.AUTH_REQUIRED else {},
        expires_at=deadline,
    )
    # The people who may answer are owed a message: the outbox rows commit with the request.
    outbox_for_request(request, now)
    attempt.status = AttemptStatus.INTERRUPTED
    attempt.ended_at = now
    attempt.lease_expires_at = None
    set_attempt_cost(run, attempt, parsed_cost)
    attempt.save()
    run.status = next_status(
        run.status, "interrupt_input" if kind == RequestKind.INPUT_REQUIRED else "interrupt_auth"
    )
    # A pause asked while the step ran is superseded: a person answering is the continuation.
    clear_pause_request(run)
    run.pending_request = request
    append_event(
        run,
        EventType.RUN_INTERRUPTED,
        f"worker:{attempt.worker_id}",
        {
            "request_id": request.id,
            "kind": kind,
            "checkpoint_id": checkpoint_id,
            "step_id": request.step_id,
            "expires_at": deadline.isoformat(),
        },
    )
    run.save()
    return request


def _breakpoint(
    *,
    attempt_id: str,
    lease_epoch: int,
    cancel_epoch: int,
    checkpoint_id: str,
    reason: str,
    context: Any,
    cost: Any,
) -> InputRequest:
    step = context.get("breakpoint") if isinstance(context, dict) else None
    if step is not None and (not isinstance(step, str) or len(step) > 100):
        raise HoldpointError("invalid_input", "context.breakpoint must be a step name.")
    parsed_cost = parse_cost(cost)
    fenced = lock_for_worker_write(
        attempt_id=attempt_id, lease_epoch=lease_epoch, cancel_epoch=cancel_epoch
    )
    run, attempt, now = fenced.run, fenced.attempt, fenced.now
    if run.latest_checkpoint_id != checkpoint_id:
        raise HoldpointError(
            "stale_checkpoint",
            "A pause must be on the run's latest checkpoint.",
            latest_checkpoint_id=run.latest_checkpoint_id,
        )
    attempt.status = AttemptStatus.INTERRUPTED
    attempt.ended_at = now
    attempt.lease_expires_at = None
    set_attempt_cost(run, attempt, parsed_cost)
    attempt.save()
    # A pause someone asked for meanwhile is this one: it is where the run stops anyway.
    request = pause_locked(
        run,
        attempt=attempt,
        transition="interrupt_pause",
        now=now,
        actor=f"worker:{attempt.worker_id}",
        reason=reason[:2000],
        paused_by=run.pause_actor or "system:breakpoint",
        requested_at=run.pause_requested_at,
        breakpoint=step,
    )
    run.save()
    return request


LOG_LEVELS = ("debug", "info", "warning", "error")


@transaction.atomic(durable=True)
def attempt_log(
    *,
    attempt_id: str,
    lease_epoch: int,
    cancel_epoch: int,
    message: str,
    level: str = "info",
    step: str = "",
    data: Any = None,
    worker_token_id: int | None = None,
) -> RunEvent:
    """Add an agent's log line to the run's timeline (event ``agent.log``).

    Fenced like every intention: a worker that lost its lease or whose run was
    cancelled cannot add to the timeline of a run it no longer works on.
    """
    if not isinstance(message, str) or not message.strip() or len(message) > 2000:
        raise HoldpointError("invalid_input", "message must be 1 to 2,000 characters.")
    if level not in LOG_LEVELS:
        raise HoldpointError("invalid_input", f"level must be one of {', '.join(LOG_LEVELS)}.")
    if data is not None and (not isinstance(data, dict) or too_deep(data)):
        raise HoldpointError("invalid_input", "data must be a JSON object.")
    fenced = lock_for_worker_write(
        attempt_id=attempt_id,
        lease_epoch=lease_epoch,
        cancel_epoch=cancel_epoch,
        worker_token_id=worker_token_id,
    )
    run, attempt = fenced.run, fenced.attempt
    event = append_event(
        run,
        EventType.AGENT_LOG,
        f"worker:{attempt.worker_id}",
        {
            "attempt_id": attempt.id,
            "level": level,
            "step": str(step or "")[:100],
            "message": message,
            "data": data or {},
        },
    )
    run.save(update_fields=["last_event_seq", "updated_at"])
    return event


@transaction.atomic(durable=True)
def attempt_complete(
    *,
    attempt_id: str,
    lease_epoch: int,
    cancel_epoch: int,
    result: Any,
    cost: Any = None,
    worker_token_id: int | None = None,
) -> Run:
    parsed_cost = parse_cost(cost)
    fenced = lock_for_worker_write(
        attempt_id=attempt_id,
        lease_epoch=lease_epoch,
        cancel_epoch=cancel_epoch,
        worker_token_id=worker_token_id,
    )
    run, attempt, now = fenced.run, fenced.attempt, fenced.now
    attempt.status = AttemptStatus.SUCCEEDED
    attempt.ended_at = now
    attempt.lease_expires_at = None
    set_attempt_cost(run, attempt, parsed_cost)
    run.status = next_status(run.status, "complete")
    run.result = result
    run.finished_at = now
    run.failure_class = ""
    clear_pause_request(run)  # the last step finished: there is nothing left to pause
    with batched_events(run):
        append_event(
            run, EventType.RUN_SUCCEEDED, f"worker:{attempt.worker_id}", {"attempt_id": attempt.id}
        )
        # The attempt, the event and the run in one statement.
        write_run(
            run,
            attempt=attempt,
            attempt_fields=["status", "ended_at", "lease_expires_at", "cost"],
            fields=[
                "status",
                "result",
                "finished_at",
                "failure_class",
                "pause_reason",
                "pause_actor",
                "pause_requested_at",
                "pause_expires_in",
                "cost",
                "last_event_seq",
                "updated_at",
            ],
        )
    return run
