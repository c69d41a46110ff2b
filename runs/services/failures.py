"""Services for when an attempt goes wrong: a classified failure with backoff or a stop,
a lost lease, an unanswered question. Split from ``lifecycle`` (the happy path).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils.translation import gettext_noop

from runs.agents import RetryPolicy, agent_spec
from runs.errors import HoldpointError
from runs.events import EventType, append_event
from runs.models import Attempt, InputRequest, Run
from runs.services._base import (
    clear_pause_request,
    close_pending_request,
    error_fingerprint,
    lock_for_worker_write,
    parse_cost,
    pause_as_requested,
    queue_attempt,
    set_attempt_cost,
)
from runs.services.lifecycle import _finish_cancel
from runs.services.notifications import APPROVAL_NOT_APPLIED, outbox_not_applied
from runs.states import (
    AttemptReason,
    AttemptStatus,
    FailureClass,
    RequestStatus,
    RunStatus,
    next_status,
)

_EXPLICIT_CLASSES = {
    FailureClass.TRANSIENT,
    FailureClass.DETERMINISTIC,
    FailureClass.SIDE_EFFECT_UNKNOWN,
    FailureClass.DENIED,
}


def classify(error_class: str | None, error_type: str, policy: RetryPolicy) -> str:
    """The failure class: the worker's word when it gives one, else the agent's policy."""
    if error_class:
        if error_class not in _EXPLICIT_CLASSES:
            raise HoldpointError(
                "invalid_input",
                f"error.class must be one of {', '.join(sorted(_EXPLICIT_CLASSES))}.",
            )
        return error_class
    if error_type in policy.non_retryable:
        return FailureClass.DETERMINISTIC
    return FailureClass.TRANSIENT


def retry_budget(run: Run) -> tuple[int, int] | None:
    """(attempts failed in a row, the agent's ``max_attempts``): how much of the automatic
    retry budget is spent, counted as ``attempt_fail`` counts it (a person's retry starts a
    new count). None for an agent no longer known."""
    try:
        policy = agent_spec(run.agent).retry_policy
    except HoldpointError:
        return None
    failures, _same = _failures_in_a_row(run, "")
    return failures, policy.max_attempts


def _failures_in_a_row(run: Run, fingerprint: str, step: str | None = None) -> tuple[int, int]:
    """Count (failures, same-fingerprint failures) back from the newest attempt.

    Crashes (``lost``) and releases (``aborted``) are skipped: they are not errors.
    Progress (an interrupted or succeeded attempt) ends the run of failures, and so
    does a person's retry: it is where a new budget starts. With ``step`` (a step with its
    own retry policy) only that step's failures are counted.
    """
    failures = same = 0
    same_open = True
    for status, reason, print_, failed_step in run.attempts.order_by("-number").values_list(
        "status", "reason", "error_fingerprint", "error_step"
    ):
        if status in (AttemptStatus.LOST, AttemptStatus.ABORTED, AttemptStatus.QUEUED):
            if reason == AttemptReason.RETRY:
                break  # a person's retry (queued, or its attempt crashed): a new count
            continue
        if status != AttemptStatus.FAILED:
            break
        if step is not None and failed_step != step:
            if reason == AttemptReason.RETRY:
                break
            continue
        failures += 1
        if same_open and print_ == fingerprint:
            same += 1
        else:
            same_open = False
        if reason == AttemptReason.RETRY:
            break
    return failures, same


@transaction.atomic(durable=True)
def attempt_fail(
    *,
    attempt_id: str,
    lease_epoch: int,
    cancel_epoch: int,
    error: dict[str, Any],
    cost: Any = None,
    worker_token_id: int | None = None,
) -> Run:
    """Record the attempt's error, classify it, then back off and retry or stop the run."""
    if not isinstance(error, dict) or not isinstance(error.get("type"), str) or not error["type"]:
        raise HoldpointError("invalid_input", "error needs a type (and a message).")
    error_type = error["type"][:200]
    message = str(error.get("message") or "")[:10_000]
    step = str(error.get("step") or "")[:100]
    parsed_cost = parse_cost(cost)
    fenced = lock_for_worker_write(
        attempt_id=attempt_id,
        lease_epoch=lease_epoch,
        cancel_epoch=cancel_epoch,
        worker_token_id=worker_token_id,
    )
    run, attempt, now = fenced.run, fenced.attempt, fenced.now
    spec = agent_spec(run.agent)
    policy = spec.policy_for(step)
    own_policy = step if step in spec.step_retry else None
    failure_class = classify(error.get("class"), error_type, policy)
    fingerprint = error_fingerprint(error_type=error_type, message=message, step=step)
    attempt.status = AttemptStatus.FAILED
    attempt.ended_at = now
    attempt.lease_expires_at = None
    attempt.error_class = failure_class
    attempt.error_type = error_type
    attempt.error_message = message
    attempt.error_step = step
    attempt.error_fingerprint = fingerprint
    set_attempt_cost(run, attempt, parsed_cost)
    attempt.save()
    if error_type == APPROVAL_NOT_APPLIED and attempt.resume_request_id:
        # The attempt was resumed with an approval and ended without using it (issue 24):
        # its approvers are told, in this transaction, about the request the attempt names.
        approved = (
            InputRequest.objects.filter(pk=attempt.resume_request_id, status=RequestStatus.ANSWERED)
            .select_related("answered_by")
            .first()
        )
        if approved is not None:
            outbox_not_applied(approved, now)
    worker = f"worker:{attempt.worker_id}"
    append_event(
        run,
        EventType.ATTEMPT_FAILED,
        worker,
        {
            "attempt_id": attempt.id,
            "class": failure_class,
            "type": error_type,
            "message": message[:500],
            "fingerprint": fingerprint,
            "step": step,
        },
    )
    if failure_class != FailureClass.TRANSIENT:
        _stop(run, failure_class, f"{error_type}: {message}"[:1000], now=now, actor=worker)
    else:
        failures, same = _failures_in_a_row(run, fingerprint, own_policy)
        if same >= policy.repeated_error_threshold:
            _stop(
                run,
                FailureClass.REPEATED_ERROR,
                f"The same error {same} times in a row: {error_type}: {message}"[:1000],
                now=now,
                actor=worker,
            )
        elif failures >= policy.max_attempts:
            _stop(
                run,
                FailureClass.TRANSIENT,
                f"Retry budget spent ({failures} of {policy.max_attempts} attempts failed).",
                now=now,
                actor=worker,
            )
        elif policy.cost_budget is not None and run.cost >= policy.cost_budget:
            _stop(
                run,
                FailureClass.TRANSIENT,
                f"Cost budget spent ({run.cost} of {policy.cost_budget}).",
                now=now,
                actor=worker,
            )
        elif run.status == RunStatus.PAUSE_REQUESTED:
            # It would back off and try again: a pause was asked meanwhile, so the run
            # stops here instead and the retry is the continuation.
            pause_as_requested(run, attempt, now=now, actor=worker)
        else:
            delay = policy.backoff_seconds(failures)
            not_before = now + dt.timedelta(seconds=delay)
            run.status = next_status(run.status, "fail_retry")
            new = queue_attempt(
                run,
                reason=AttemptReason.AUTO_RETRY,
                resume_from=run.latest_checkpoint,
                not_before=not_before,
            )
            append_event(
                run,
                EventType.RUN_BACKING_OFF,
                "system:retry",
                {
                    "next_attempt_id": new.id,
                    "not_before": not_before.isoformat(),
                    "delay_seconds": round(delay, 3),
                    "failures_in_a_row": failures,
                },
            )
    run.save()
    return run


def _stop(
    run: Run,
    failure_class: str,
    detail: str,
    *,
    now: Any,
    actor: str,
    transition: str = "fail_stop",
    payload: dict[str, Any] | None = None,
) -> None:
    """The run fails for good: its status, failure and end, and the ``run.failed`` event
    (by default saying the class and the detail)."""
    run.status = next_status(run.status, transition)
    clear_pause_request(run)
    run.failure_class = failure_class
    run.failure_detail = detail
    run.finished_at = now
    if payload is None:
        payload = {"failure_class": failure_class, "detail": detail}
    append_event(run, EventType.RUN_FAILED, actor, payload)


def fail_locked_for_lost_lease(run: Run, attempt: Attempt, *, now: Any) -> None:
    """Under the run lock: the current attempt's lease ran out. Mark it lost, then
    finish a pending cancel, or start again from the latest checkpoint (capped)."""
    attempt.status = AttemptStatus.LOST
    attempt.ended_at = now
    attempt.error_class = FailureClass.LEASE_LOST
    attempt.error_message = "The lease ran out without a heartbeat."
    attempt.save()
    actor = "system:sweeper"
    append_event(
        run,
        EventType.ATTEMPT_LOST,
        actor,
        {
            "attempt_id": attempt.id,
            "worker_id": attempt.worker_id,
            "lease_epoch": attempt.lease_epoch,
        },
    )
    if run.status == RunStatus.CANCEL_REQUESTED:
        _finish_cancel(run, now=now, actor=actor)
        return
    if run.status == RunStatus.PAUSE_REQUESTED:
        # The worker died (or froze) after the pause was asked: the run is paused at its
        # latest checkpoint, not requeued, and no attempt of it runs meanwhile.
        pause_as_requested(run, attempt, now=now, actor=actor)
        return
    cap = agent_spec(run.agent).retry_policy.max_lease_losses or settings.HOLDPOINT_MAX_LEASE_LOSSES
    lost_in_a_row = 0
    for status in run.attempts.order_by("-number").values_list("status", flat=True):
        if status != AttemptStatus.LOST:
            break
        lost_in_a_row += 1
    if lost_in_a_row >= cap:
        _stop(
            run,
            FailureClass.LEASE_LOST,
            f"The worker lost its lease {lost_in_a_row} times in a row.",
            now=now,
            actor=actor,
            transition="lease_expired_stop",
        )
        return
    run.status = next_status(run.status, "lease_expired_retry")
    new = queue_attempt(
        run, reason=AttemptReason.LEASE_EXPIRED, resume_from=run.latest_checkpoint, not_before=now
    )
    append_event(
        run, EventType.RUN_REQUEUED, actor, {"next_attempt_id": new.id, "reason": "lease_expired"}
    )


def expire_request_locked(run: Run, request: InputRequest, *, now: Any) -> None:
    """Under the run lock: nobody answered in time. The run fails ``input_expired``;
    a retry from the same checkpoint asks again."""
    close_pending_request(
        run,
        status=RequestStatus.EXPIRED,
        reason=gettext_noop("No response before it expired"),
        now=now,
        actor="system:sweeper",
    )
    _stop(
        run,
        FailureClass.INPUT_EXPIRED,
        f"No response to {request.id} by {request.expires_at.isoformat()}.",
        now=now,
        actor="system:sweeper",
        transition="expire",
        payload={"failure_class": FailureClass.INPUT_EXPIRED, "request_id": request.id},
    )
