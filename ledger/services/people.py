"""What people (and the reconciler) do with side effects: reconcile and compensate."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.events import SideEffectEvent, outcome_event
from ledger.models import Resolution, Reversibility, SideEffect, SideEffectStatus
from ledger.services._common import (
    check_text,
    compensation_key_for,
    effect_tool,
    emit,
    lock_effect,
    pending_is_stale,
    settle_delta,
)
from ledger.tools import ActionFailed, OutcomeUnknown, ToolResult, can_compensate
from runs.errors import HoldpointError
from runs.services import UserLike, actor_for, user_or_none

S = SideEffectStatus


@transaction.atomic(durable=True)
def side_effect_reconcile(
    *,
    operation_id: str,
    outcome: str,
    note: str,
    external_reference: str | None = None,
    user: UserLike = None,
    actor: str | None = None,
) -> SideEffect:
    """Settle an ``unknown`` (or stale ``pending``) effect as it really went.

    ``confirmed``: it happened (give the external reference when there is one).
    ``not_applied``: it did not happen; a retry of the run may do it again, with the
    same idempotency key. Until then the run cannot be retried.
    """
    if outcome not in Resolution.values:
        raise HoldpointError("invalid_input", "outcome must be confirmed or not_applied.")
    note = check_text(note, "note", 2000)
    reference = check_text(external_reference, "external_reference", 500, required=False)
    run, effect = lock_effect(operation_id)
    if effect.status == S.PENDING and not pending_is_stale(effect):
        raise HoldpointError(
            "invalid_state",
            "The side effect is still in progress: its worker holds a live lease and may yet "
            "record the outcome.",
            operation_id=effect.operation_id,
        )
    if effect.status not in (S.PENDING, S.UNKNOWN):
        detail = f"The side effect is already {effect.status}; there is nothing to reconcile."
        if effect.resolved_at is not None:
            detail = (
                f"Already reconciled as {effect.resolution} by {effect.resolved_actor} "
                f"at {effect.resolved_at.isoformat()}."
            )
        raise HoldpointError(
            "invalid_state",
            detail,
            operation_id=effect.operation_id,
            side_effect_status=effect.status,
            resolved_by=effect.resolved_actor or None,
            resolved_at=effect.resolved_at.isoformat() if effect.resolved_at else None,
        )
    actor = actor or actor_for(user, "system:reconciler")
    now = timezone.now()
    previous = effect.status
    effect.status = S.CONFIRMED if outcome == Resolution.CONFIRMED else S.FAILED
    if reference:
        effect.external_reference = reference
    effect.resolution = outcome
    effect.resolution_note = note
    effect.resolved_by = user_or_none(user)
    effect.resolved_actor = actor[:200]
    effect.resolved_at = now
    effect.save()
    emit(
        run,
        SideEffectEvent.RECONCILED,
        actor,
        effect,
        outcome=outcome,
        previous_status=previous,
        external_reference=effect.external_reference,
        note=note,
    )
    return effect


def compensation_preview(effect: SideEffect) -> dict[str, Any] | None:
    """What undoing ``effect`` would change, read from the tool now, or None when the tool
    cannot say (it has no ``compensation_preview``). See ``ConfigStoreTool``."""
    try:
        tool = effect_tool(effect)
    except HoldpointError:
        return None
    preview = getattr(tool, "compensation_preview", None)
    if not callable(preview):
        return None
    try:
        found = preview(effect)
    except (ActionFailed, OutcomeUnknown, OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _check_target_unchanged(effect: SideEffect) -> None:
    """Refuse ``target_changed`` when something was written on the target after the effect."""
    preview = compensation_preview(effect)
    if preview is None or not preview.get("changed_after"):
        return
    raise HoldpointError(
        "target_changed",
        f"{effect.target} changed after this effect (now version "
        f"{preview.get('current_version')}; this effect wrote version "
        f"{preview.get('written_version')}). Restoring would also undo the newer versions; "
        "send force: true to restore anyway.",
        operation_id=effect.operation_id,
        current_version=preview.get("current_version"),
        written_version=preview.get("written_version"),
        versions_after=preview.get("versions_after"),
    )


@transaction.atomic(durable=True)
def _compensation_start(
    *, operation_id: str, user: UserLike, actor: str, reason: str = "", force: bool = False
) -> SideEffect:
    """Write the intent to compensate and commit it, before the tool is called."""
    run, effect = lock_effect(operation_id)
    if effect.reversibility == Reversibility.IRREVERSIBLE:
        raise HoldpointError(
            "invalid_state",
            f"{effect.tool} on {effect.target} cannot be undone.",
            operation_id=effect.operation_id,
        )
    if effect.status not in (S.CONFIRMED, S.COMPENSATION_FAILED):
        raise HoldpointError(
            "invalid_state",
            f"Only an effect that happened can be compensated; this one is {effect.status}.",
            operation_id=effect.operation_id,
            side_effect_status=effect.status,
        )
    tool = effect_tool(effect)
    if not can_compensate(tool):
        raise HoldpointError(
            "invalid_state",
            f"The {effect.tool} tool has no compensating action.",
            operation_id=effect.operation_id,
        )
    now = timezone.now()
    if (
        effect.compensation_in_progress
        and effect.compensation_started_at is not None
        and effect.compensation_started_at > now - settle_delta()
    ):
        # A compensation started earlier may still be running. After the settle time it is
        # taken to have crashed and may be run again: with the same key, so a compensation
        # that did go through is recognised rather than done twice.
        raise HoldpointError(
            "invalid_state",
            f"A compensation started at {effect.compensation_started_at.isoformat()} by "
            f"{effect.compensation_actor} is still in progress.",
            operation_id=effect.operation_id,
        )
    if not force:
        # Under the run lock, like every check before a write; the tool is read, not changed.
        _check_target_unchanged(effect)
    effect.compensation_idempotency_key = compensation_key_for(effect)
    effect.compensation_reason = reason
    effect.compensation_started_at = now
    effect.compensation_ended_at = None
    effect.compensation_actor = actor[:200]
    effect.compensated_by = user_or_none(user)
    effect.save()
    emit(
        run,
        SideEffectEvent.COMPENSATION_STARTED,
        actor,
        effect,
        compensation_idempotency_key=effect.compensation_idempotency_key,
        compensating_action=effect.compensating_action,
        reason=reason or None,
        forced=force or None,
    )
    return effect


@transaction.atomic(durable=True)
def _compensation_finish(
    *,
    operation_id: str,
    done: ToolResult | None,
    error: dict[str, Any] | None,
    actor: str,
) -> SideEffect:
    run, effect = lock_effect(operation_id)
    now = timezone.now()
    effect.compensation_ended_at = now
    if done is not None:
        effect.status = S.COMPENSATED
        effect.compensation_reference = done.external_reference[:500]
        effect.compensation_result = done.result
        effect.compensation_error = None
    else:
        effect.status = S.COMPENSATION_FAILED
        effect.compensation_error = error
    effect.save()
    emit(
        run,
        outcome_event(effect.status),
        actor,
        effect,
        compensation_idempotency_key=effect.compensation_idempotency_key,
        compensation_reference=effect.compensation_reference,
        error=error,
    )
    return effect


def side_effect_compensate(
    *,
    operation_id: str,
    user: UserLike = None,
    actor: str | None = None,
    reason: str = "",
    force: bool = False,
) -> SideEffect:
    """Undo (or offset) a confirmed effect with the tool's compensating action.

    ``reason`` is kept with the effect and its event. When the target changed after the
    effect (the tool's ``compensation_preview`` says another version is on top), this
    refuses ``target_changed`` unless ``force`` (a person said "restore anyway").

    Write the intent and commit; run the tool outside any transaction under the
    effect's own compensation key; record ``compensated`` or ``compensation_failed``
    (STYLE rule 8). A failed compensation may be run again with the same key.
    """
    actor = actor or actor_for(user)
    reason = check_text(reason, "reason", 2000, required=False) or ""
    effect = _compensation_start(
        operation_id=operation_id, user=user, actor=actor, reason=reason, force=force
    )
    tool = effect_tool(effect)
    try:
        done = tool.compensate(effect)  # type: ignore[attr-defined]
    except (ActionFailed, OutcomeUnknown) as exc:
        error = exc.as_error()
        if isinstance(exc, OutcomeUnknown):
            error["outcome_unknown"] = True
        return _compensation_finish(operation_id=operation_id, done=None, error=error, actor=actor)
    except Exception as exc:
        _compensation_finish(
            operation_id=operation_id,
            done=None,
            error={"type": type(exc).__name__, "message": str(exc)[:2000]},
            actor=actor,
        )
        raise
    return _compensation_finish(operation_id=operation_id, done=done, error=None, actor=actor)
