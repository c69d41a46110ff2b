"""The control operations people and automation call: resume, cancel, retry.

Each is a durable command: committed before anything else happens, so the user
sees it accepted even when the worker that should react has crashed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils import timezone
from django.utils.translation import gettext, gettext_noop

from runs import db
from runs.action_links import ActionLink
from runs.agents import agent_spec
from runs.db import row_now
from runs.errors import HoldpointError
from runs.events import EventType, append_event, batched_events, cancel_notice, how, work_notice
from runs.idempotency import joinable
from runs.leases import worker_holds
from runs.models import Attempt, Checkpoint, InputRequest, Run
from runs.schemas import validate_value
from runs.services._base import (
    UserLike,
    actor_for,
    clear_pause_request,
    close_pending_request,
    lock_run,
    measured,
    queue_attempt,
    user_or_none,
    write_run,
)
from runs.services.approvals import answered_payload, approval_decide
from runs.states import (
    ANSWERABLE,
    RETRYABLE,
    TERMINAL,
    AttemptReason,
    AttemptStatus,
    FailureClass,
    RequestKind,
    RequestStatus,
    RunStatus,
    next_status,
)

# Checks other apps add to retry (the ledger refuses while side effects are unsettled).
# Each returns None to allow or a sentence saying why not; runs never imports them.
RetryGuard = Callable[[Run], "str | None"]
_retry_guards: list[RetryGuard] = []


def register_retry_guard(guard: RetryGuard) -> RetryGuard:
    if guard not in _retry_guards:
        _retry_guards.append(guard)
    return guard


def retry_blockers(run: Run) -> list[str]:
    """Why ``run`` may not be retried now (empty when it may); the dashboard shows these."""
    reasons: list[str] = []
    if run.status not in RETRYABLE:
        reasons.append(
            gettext("Only a failed or cancelled run can be retried; this one is %(status)s.")
            % {"status": run.status}
        )
    try:
        agent_spec(run.agent)
    except HoldpointError:
        reasons.append(
            gettext("The agent %(agent)r is no longer registered.") % {"agent": run.agent}
        )
    for guard in _retry_guards:
        why = guard(run)
        if why:
            reasons.append(why)
    return reasons


def _answered_detail(request: InputRequest) -> dict[str, Any]:
    who = request.answered_by.get_username() if request.answered_by else None
    return {
        "request_id": request.id,
        "request_status": request.status,
        "answered_by": who,
        "answered_at": request.answered_at.isoformat() if request.answered_at else None,
    }


@measured("resume")
@joinable
def run_resume(
    *,
    run_id: str,
    request_id: str,
    checkpoint_id: str | None,
    value: Any = None,
    user: UserLike = None,
    actor: str | None = None,
    via: str = "",
    identity: str = "",
    link: ActionLink | None = None,
    round_seen: int | None = None,
) -> Run:
    """Answer the question that was asked, on the state it was asked on (compare-and-set).

    A stale caller (the request answered, expired, closed, or the run moved on) gets
    a 409 that names who answered and when; nothing is re-run silently. What the answer
    is depends on the request's kind: a question's value, one person's decision on an
    approval (which may leave it waiting for more), or nothing to continue a pause.

    ``via`` says how the person decided ("dashboard", "api", "email", "cli") and
    ``identity`` with which credential (``runs/audit.py``), in the events and the
    approval's record. ``link``: the decision comes from a link in an e-mail
    (``runs/action_links.py``), which decides only the approval it names, on the version
    it was sent about, once. ``round_seen``: the approval's edit round the person saw (a
    Slack message); an edit since refuses the decision.
    """
    door = how(via=via, identity=identity)
    # The run lock makes the compare-and-set atomic: two resumes of one request
    # serialise here and the second sees the first one's answer.
    run = lock_run(run_id)
    request = _the_request_asked(run, request_id, checkpoint_id)
    actor = actor or actor_for(user)
    if link is not None and (
        request.kind != RequestKind.AUTH_REQUIRED or link.request_id != request.id
    ):
        raise HoldpointError(
            "request_mismatch", "This link is about another request.", request_id=request.id
        )
    if request.kind == RequestKind.PAUSE:
        _no_value_to_continue(value)
    elif request.kind == RequestKind.AUTH_REQUIRED:
        # Under the approval's policy (runs/services/approvals.py): this decision may be
        # one of several the request needs, and then it stays pending.
        decided = approval_decide(
            run,
            request,
            value,
            user=user,
            actor=actor,
            via=via,
            identity=identity,
            link=link,
            round_seen=round_seen,
        )
        if decided is None:
            run.save()
            return run
        value = decided
    else:
        validate_value(request.accepted_schema, value, what="answer")
    _answer_and_queue(run, request, value, user=user, actor=actor, door=door)
    return run


def _the_request_asked(run: Run, request_id: str, checkpoint_id: str | None) -> InputRequest:
    """The pending request ``request_id`` of ``run`` (locked), asked on the run's latest
    checkpoint ``checkpoint_id`` and not expired; else the 409 that says what happened."""
    # Read under the run's lock (no queryset to build: docs/performance.md); who answered
    # is read only when the answer is a refusal that names them.
    request = db.get(InputRequest, request_id)
    if request is not None and request.run_id != run.id:
        request = None
    if request is None:
        raise HoldpointError(
            "request_mismatch",
            f"{request_id!r} is not a question of this run.",
            pending_request_id=run.pending_request_id,
        )
    if request.status == RequestStatus.ANSWERED:
        who = request.answered_by.get_username() if request.answered_by else "someone"
        when = request.answered_at.isoformat() if request.answered_at else "earlier"
        raise HoldpointError(
            "request_mismatch",
            f"Already answered by {who} at {when}.",
            **_answered_detail(request),
        )
    if request.status == RequestStatus.EXPIRED:
        raise HoldpointError(
            "request_expired",
            f"The request expired at {request.expires_at.isoformat()}; retry the run to ask again.",
            **_answered_detail(request),
        )
    if request.status == RequestStatus.CANCELLED:
        raise HoldpointError(
            "invalid_state",
            f"The request was closed: {request.closed_reason or 'the run moved on'}.",
            **_answered_detail(request),
        )
    if run.status not in ANSWERABLE:
        raise HoldpointError(
            "invalid_state", f"The run is {run.status}, not waiting for an answer."
        )
    if run.pending_request_id != request.id:
        raise HoldpointError(
            "request_mismatch",
            "The run is waiting on a different question.",
            pending_request_id=run.pending_request_id,
        )
    if run.latest_checkpoint_id != checkpoint_id or request.checkpoint_id != checkpoint_id:
        raise HoldpointError(
            "stale_checkpoint",
            "The run's state changed since this question was asked.",
            latest_checkpoint_id=run.latest_checkpoint_id,
        )
    if request.expires_at <= timezone.now():
        raise HoldpointError(
            "request_expired",
            f"The request expired at {request.expires_at.isoformat()}; retry the run to ask again.",
            request_id=request.id,
        )
    return request


def _no_value_to_continue(value: Any) -> None:
    if value is not None:
        raise HoldpointError(
            "invalid_input",
            "Continuing a paused run takes no value.",
            errors=[{"pointer": "/", "message": "must be null or absent"}],
        )


def _answer_and_queue(
    run: Run,
    request: InputRequest,
    value: Any,
    *,
    user: UserLike,
    actor: str,
    door: dict[str, str],
) -> None:
    """Record the answer (or the continuation of a pause) and queue the new attempt that
    resumes from the checkpoint the request was asked on, with its events, in one write."""
    now = timezone.now()
    request.status = RequestStatus.ANSWERED
    request.answer = value
    request.answered_by = user_or_none(user)
    request.answered_at = now
    with batched_events(run):
        if request.kind != RequestKind.PAUSE:
            append_event(
                run,
                EventType.REQUEST_ANSWERED,
                actor,
                {
                    "request_id": request.id,
                    "kind": request.kind,
                    "answer": value,
                    **answered_payload(request, value),
                    **door,
                },
            )
        run.status = next_status(run.status, "resume")
        run.pending_request = None
        attempt = queue_attempt(
            run,
            reason=AttemptReason.RESUME,
            resume_from=None,
            resume_request=request,
            not_before=row_now(run),
            written_later=True,
        )
        # Checked by _the_request_asked: the run's latest checkpoint, the question's own.
        attempt.resume_from_id = request.checkpoint_id
        resumed = {
            "attempt_id": attempt.id,
            "request_id": request.id,
            "checkpoint_id": request.checkpoint_id,
            **door,
        }
        if request.kind == RequestKind.PAUSE:
            paused_seconds = round((now - request.created_at).total_seconds(), 3)
            append_event(
                run,
                EventType.RUN_CONTINUED,
                actor,
                {**resumed, "paused_seconds": paused_seconds},
            )
        else:
            append_event(run, EventType.RUN_RESUMED, actor, resumed)
        # The answer, the new attempt, the events, the run and the workers' wake-up in one
        # statement.
        write_run(run, inserts=[attempt], updates=[request], notify=work_notice(run.agent))


@measured("cancel")
@joinable
def run_cancel(
    *,
    run_id: str,
    user: UserLike = None,
    actor: str | None = None,
    reason: str = "",
    via: str = "",
    identity: str = "",
) -> Run:
    """Cancel the goal. ``cancel_epoch`` moves first so that nothing a worker sends
    after this commit can change the run; a live lease makes it ``cancel_requested``
    until the worker acknowledges or its lease runs out. ``via`` and ``identity``: how
    (``runs/audit.py``)."""
    door = how(via=via, identity=identity)
    if not isinstance(reason, str) or len(reason) > 2000:
        raise HoldpointError("invalid_input", "reason must be text of at most 2,000 characters.")
    run = lock_run(run_id)
    if run.status == RunStatus.CANCEL_REQUESTED:
        return run  # Already accepted; asking twice changes nothing.
    if run.status in TERMINAL:
        raise HoldpointError(
            "invalid_state", f"The run already {run.status}; there is nothing to cancel."
        )
    actor = actor or actor_for(user)
    now = row_now(run)
    run.cancel_epoch += 1
    run.cancel_reason = reason
    # Read after the lock is held: the version the lock holder before us left behind.
    attempt = db.get(Attempt, run.current_attempt_id) if run.current_attempt_id else None
    if attempt is not None:
        run.current_attempt = attempt  # the answer shows it: no second read
    lease_live = worker_holds(run, attempt, now)
    changed_attempt = None
    notify = None
    with batched_events(run):
        append_event(
            run,
            EventType.RUN_CANCEL_REQUESTED,
            actor,
            {
                "cancel_epoch": run.cancel_epoch,
                "reason": reason,
                "lease_live": lease_live,
                **door,
            },
        )
        clear_pause_request(run)  # cancel always wins over a pause
        if lease_live:
            assert attempt is not None
            run.status = next_status(run.status, "cancel_live")
            notify = cancel_notice(attempt.id)
        else:
            run.status = next_status(run.status, "cancel")
            if attempt is not None and attempt.status in (
                AttemptStatus.QUEUED,
                AttemptStatus.RUNNING,
            ):
                attempt.status = (
                    AttemptStatus.ABORTED
                    if attempt.status == AttemptStatus.QUEUED
                    else AttemptStatus.LOST
                )
                attempt.ended_at = now
                attempt.lease_expires_at = None
                changed_attempt = attempt
            close_pending_request(
                run,
                status=RequestStatus.CANCELLED,
                reason=gettext_noop("Closed: run cancelled"),  # stored in English, shown translated
                now=now,
                actor=actor,
            )
            run.failure_class = FailureClass.CANCELLED
            run.finished_at = now
            run.not_before = None
            append_event(
                run, EventType.RUN_CANCELLED, actor, {"cancel_epoch": run.cancel_epoch, **door}
            )
        # Events, attempt, run and the worker's wake-up in one statement.
        write_run(run, attempt=changed_attempt, notify=notify)
    return run


@measured("retry")
@joinable
def run_retry(
    *,
    run_id: str,
    reason: str,
    from_checkpoint_id: str | None = None,
    user: UserLike = None,
    actor: str | None = None,
    via: str = "",
    identity: str = "",
) -> Run:
    """Try a failed or cancelled run again from a checkpoint, in a new attempt. The old
    attempts keep their errors, costs and history. ``via`` and ``identity``: how
    (``runs/audit.py``)."""
    door = how(via=via, identity=identity)
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 2000:
        raise HoldpointError("invalid_input", "A retry needs a reason (1 to 2,000 characters).")
    run = lock_run(run_id)
    if run.status not in RETRYABLE:
        raise HoldpointError(
            "invalid_state",
            f"The run is {run.status}; only a failed or cancelled run can be retried.",
        )
    if from_checkpoint_id:
        checkpoint = Checkpoint.objects.filter(pk=from_checkpoint_id, run=run).first()
        if checkpoint is None:
            raise HoldpointError(
                "invalid_input",
                f"{from_checkpoint_id!r} is not a checkpoint of this run.",
                errors=[{"pointer": "/from_checkpoint", "message": "not a checkpoint of this run"}],
            )
    else:
        checkpoint = run.latest_checkpoint
    blockers = retry_blockers(run)
    if blockers:
        raise HoldpointError("retry_not_allowed", " ".join(blockers), reasons=blockers)
    actor = actor or actor_for(user)
    now = row_now(run)
    run.status = next_status(run.status, "retry")
    run.failure_class = ""
    run.failure_detail = ""
    run.result = None
    run.finished_at = None
    # Where to continue: later checkpoints stay in the history, but the run goes on from here.
    run.latest_checkpoint = checkpoint
    attempt = queue_attempt(
        run,
        reason=AttemptReason.RETRY,
        resume_from=checkpoint,
        not_before=now,
        written_later=True,
    )
    with batched_events(run):
        append_event(
            run,
            EventType.RUN_RETRIED,
            actor,
            {
                "attempt_id": attempt.id,
                "from_checkpoint": checkpoint.id if checkpoint else None,
                "reason": reason,
                **door,
            },
        )
        # The new attempt, its event, the run and the workers' wake-up in one statement.
        write_run(run, inserts=[attempt], notify=work_notice(run.agent))
    return run
