"""Outcomes: facts about the world, never fenced.

An outcome is recorded for the operation that exists whoever reports it: a stale
worker, a cancelled run, a finished one. When the reporter's epochs no longer match
the run, the outcome is still recorded, flagged ``late`` with its own event.

Two reports about one effect can disagree (a late worker, a lookup, a person).
The stronger fact wins: ``confirmed`` (someone holds an external reference) beats
``failed``, which beats ``unknown``, which beats ``pending``. A weaker report
after a stronger one changes nothing but is kept as an event, so nothing anyone
said is lost.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any, Literal

from django.db import transaction
from django.utils import timezone

from ledger.events import SideEffectEvent, outcome_event
from ledger.models import SideEffect, SideEffectStatus
from ledger.services._common import (
    attempt_is_live,
    check_text,
    effect_tool,
    emit,
    error_dict,
    lock_effect,
)
from ledger.services.intents import side_effect_begin
from ledger.tools import ActionFailed, OutcomeUnknown, get_tool
from runs.db import db_now
from runs.errors import HoldpointError
from runs.models import Attempt, Run, WorkerToken

S = SideEffectStatus
OUTCOMES = (S.CONFIRMED, S.FAILED, S.UNKNOWN)
_STRENGTH: dict[str, int] = {S.PENDING: 0, S.UNKNOWN: 1, S.FAILED: 2, S.CONFIRMED: 3}


def _is_late(
    run: Run,
    effect: SideEffect,
    *,
    lease_epoch: int | None,
    cancel_epoch: int | None,
    from_worker: bool,
) -> bool:
    """Whether a reporter holding these epochs is no longer the run's live worker.

    A worker that sends no epochs is judged by the attempt responsible for the effect:
    once that attempt no longer holds the run (its lease was lost and another attempt
    took over, the run was cancelled or finished), the report is late whatever the
    worker sent. People and the reconciler are not workers; their reports are not late.
    """
    if lease_epoch is None and cancel_epoch is None:
        if not from_worker:
            return False
        responsible = Attempt.objects.get(pk=effect.attempt_id)
        return responsible.cancel_epoch != run.cancel_epoch or not attempt_is_live(
            run, responsible, lease_now=db_now()
        )
    if cancel_epoch is not None and cancel_epoch != run.cancel_epoch:
        return True
    if lease_epoch is not None and lease_epoch != run.lease_epoch:
        return True
    attempt = (
        Attempt.objects.filter(pk=run.current_attempt_id).first()
        if run.current_attempt_id
        else None
    )
    return attempt is None or not attempt_is_live(run, attempt, lease_now=db_now())


def _reporting_attempt(run: Run, effect: SideEffect, lease_epoch: int | None) -> Attempt:
    """The attempt a report speaks for: the one of its lease epoch, else the effect's."""
    attempt = None
    if lease_epoch is not None:
        attempt = Attempt.objects.filter(run=run, lease_epoch=lease_epoch).first()
    return attempt or Attempt.objects.get(pk=effect.attempt_id)


def _reporter(run: Run, effect: SideEffect, lease_epoch: int | None) -> str:
    attempt = _reporting_attempt(run, effect, lease_epoch)
    return f"worker:{attempt.worker_id}" if attempt.worker_id else "worker"


def apply_outcome(
    run: Run,
    effect: SideEffect,
    *,
    status: str,
    external_reference: str,
    result: Any,
    error: Any,
    late: bool,
    actor: str,
    now: dt.datetime,
    reported_with: dict[str, Any] | None = None,
) -> SideEffect:
    """Under the run lock: record ``status`` unless a stronger fact is already recorded.

    ``reported_with`` goes into the event as it is (e.g. which worker token sent it)."""
    noted = reported_with or {}
    current = effect.status
    ignored_because = None
    if current in (S.COMPENSATED, S.COMPENSATION_FAILED):
        ignored_because = "the effect was already compensated"
    elif current == status:
        conflicting_reference = (
            status == S.CONFIRMED
            and external_reference
            and effect.external_reference
            and external_reference != effect.external_reference
        )
        if not conflicting_reference:
            return effect  # The same fact again (a repeated report): nothing to add.
        ignored_because = "a different external reference is already recorded"
    elif _STRENGTH[status] < _STRENGTH[current]:
        ignored_because = f"the effect is already {current}"
    if ignored_because is not None:
        emit(
            run,
            SideEffectEvent.OUTCOME_IGNORED,
            actor,
            effect,
            reported_status=status,
            external_reference=external_reference,
            error=error,
            late=late,
            reason=ignored_because,
            **noted,
        )
        return effect
    effect.status = status
    if external_reference:
        effect.external_reference = external_reference
    if result is not None:
        effect.result = result
    if error is not None:
        effect.error = error
    elif status == S.UNKNOWN:
        effect.error = {"message": "The outcome is unknown."}
    elif status == S.CONFIRMED:
        effect.error = None
    effect.late = late
    effect.outcome_at = now
    effect.outcome_actor = actor[:200]
    effect.save()
    emit(
        run,
        SideEffectEvent.LATE_OUTCOME if late else outcome_event(status),
        actor,
        effect,
        previous_status=current,
        external_reference=effect.external_reference,
        error=effect.error if status != S.CONFIRMED else None,
        late=late,
        **noted,
    )
    return effect


@transaction.atomic(durable=True)
def side_effect_record_outcome(
    *,
    operation_id: str,
    status: str,
    external_reference: str | None = None,
    result: Any = None,
    error: Any = None,
    lease_epoch: int | None = None,
    cancel_epoch: int | None = None,
    actor: str | None = None,
    worker_token_id: int | None = None,
) -> SideEffect:
    """Record what happened: ``confirmed`` (with its external reference), ``failed``
    (it did not happen) or ``unknown``. Never fenced; see the module docstring.

    ``worker_token_id``: the worker API's token. An outcome from a token other than the
    one that claimed the reporting attempt is still recorded (a fact is a fact), but
    the event says which token sent it and the actor names that token, not the worker
    whose lease it was."""
    if status not in OUTCOMES:
        raise HoldpointError("invalid_input", "status must be confirmed, failed or unknown.")
    reference = check_text(external_reference, "external_reference", 500, required=False)
    if error is not None and not isinstance(error, dict | str):
        raise HoldpointError("invalid_input", "error must be an object or a message.")
    for name, epoch in (("lease_epoch", lease_epoch), ("cancel_epoch", cancel_epoch)):
        if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)):
            raise HoldpointError("invalid_input", f"{name} must be a whole number.")
    run, effect = lock_effect(operation_id)
    late = _is_late(
        run, effect, lease_epoch=lease_epoch, cancel_epoch=cancel_epoch, from_worker=actor is None
    )
    reported_with: dict[str, Any] = {}
    if worker_token_id is not None:
        token = WorkerToken.objects.filter(pk=worker_token_id).first()
        bound = _reporting_attempt(run, effect, lease_epoch).worker_token_id
        reported_with = {
            "worker_token": token.name if token else None,
            "token_matches_lease": bound == worker_token_id,
        }
        if bound != worker_token_id and actor is None:
            actor = f"worker-token:{token.name if token else worker_token_id}"
    return apply_outcome(
        run,
        effect,
        status=status,
        external_reference=reference,
        result=result,
        error=error_dict(error),
        late=late,
        actor=actor or _reporter(run, effect, lease_epoch),
        now=timezone.now(),
        reported_with=reported_with,
    )


@dataclass(frozen=True)
class LookUp:
    """What asking the tool by idempotency key gave: ``not_found`` means act now;
    ``already_recorded``: the effect was no longer pending, nothing was asked."""

    outcome: Literal["confirmed", "failed", "unknown", "not_found", "already_recorded"]
    side_effect: SideEffect


def side_effect_look_up(
    *,
    operation_id: str,
    lease_epoch: int | None = None,
    cancel_epoch: int | None = None,
    actor: str | None = None,
) -> LookUp:
    """Ask the tool what became of a pending effect's key, and record what it says.

    Runs the tool outside any transaction. ``not_found``: the external system has no
    record, so the caller acts now with the same key (the record stays ``pending``).
    ``unknown``: the tool cannot tell; the effect becomes ``unknown``.
    """
    effect = SideEffect.objects.filter(pk=operation_id).first()
    if effect is None:
        raise HoldpointError("not_found", f"There is no side effect {operation_id!r}.")
    if effect.status != S.PENDING:
        return LookUp("already_recorded", effect)
    tool = effect_tool(effect)
    record = functools.partial(
        side_effect_record_outcome,
        operation_id=operation_id,
        lease_epoch=lease_epoch,
        cancel_epoch=cancel_epoch,
        actor=actor,
    )
    try:
        outcome = tool.lookup(effect.idempotency_key)
    except OutcomeUnknown as exc:
        return LookUp("unknown", record(status=S.UNKNOWN, error=exc.as_error()))
    if outcome is None:
        return LookUp("not_found", effect)
    effect = record(
        status=outcome.status,
        external_reference=outcome.external_reference or None,
        result=outcome.result,
        error=outcome.error,
    )
    return LookUp(outcome.status, effect)


@dataclass(frozen=True)
class Performed:
    """The decision the ledger gave, whether this call acted, and the effect as recorded."""

    decision: str
    acted: bool
    side_effect: SideEffect


def side_effect_perform(
    *,
    attempt_id: str,
    lease_epoch: int,
    cancel_epoch: int,
    step_id: str,
    tool: str,
    target: str,
    request: Any,
    reversibility: str | None = None,
    compensating_action: Any = None,
) -> Performed:
    """The whole rule in one call: write the intent and commit, look the key up or act
    outside any transaction, record the outcome.

    Raises what ``side_effect_begin`` raises (``approval_required``,
    ``side_effect_unknown``, the fence). The returned effect's status says how it
    went: ``confirmed``, ``failed`` or ``unknown`` (then fail the attempt with class
    ``side_effect_unknown``).
    """
    begin = side_effect_begin(
        attempt_id=attempt_id,
        lease_epoch=lease_epoch,
        cancel_epoch=cancel_epoch,
        step_id=step_id,
        tool=tool,
        target=target,
        request=request,
        reversibility=reversibility,
        compensating_action=compensating_action,
    )
    if begin.decision == "reuse":
        return Performed("reuse", False, SideEffect.objects.get(pk=begin.operation_id))
    if begin.decision == "look_up":
        looked = side_effect_look_up(
            operation_id=begin.operation_id, lease_epoch=lease_epoch, cancel_epoch=cancel_epoch
        )
        if looked.outcome != "not_found":
            return Performed("look_up", False, looked.side_effect)
    the_tool = get_tool(tool)
    record = functools.partial(
        side_effect_record_outcome,
        operation_id=begin.operation_id,
        lease_epoch=lease_epoch,
        cancel_epoch=cancel_epoch,
    )
    try:
        done = the_tool.execute(request, begin.idempotency_key)
    except ActionFailed as exc:
        effect = record(status=S.FAILED, error=exc.as_error())
    except OutcomeUnknown as exc:
        effect = record(status=S.UNKNOWN, error=exc.as_error())
    except Exception as exc:
        # A bug or an unexpected failure after the tool started: we cannot tell what it did.
        record(status=S.UNKNOWN, error={"type": type(exc).__name__, "message": str(exc)[:2000]})
        raise
    else:
        effect = record(
            status=S.CONFIRMED, external_reference=done.external_reference, result=done.result
        )
    return Performed(begin.decision, True, effect)
