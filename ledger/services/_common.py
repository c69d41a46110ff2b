"""Shared pieces of the ledger services: keys, the run lock, staleness, events."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from ledger.models import SideEffect, SideEffectStatus
from ledger.tools import Tool, tool_for_agent
from runs.db import db_now
from runs.errors import HoldpointError
from runs.events import append_event
from runs.leases import lease_ran_out_q, worker_holds
from runs.models import Attempt, Run
from runs.services import lock_run
from runs.states import AttemptStatus

# Room for the ".undo" suffix of the compensation key within the 255 characters.
MAX_KEY_LENGTH = 240


def idempotency_key_for(*, run_id: str, step_id: str, tool: str, generation: int = 0) -> str:
    """The key of a step's use of a tool: the same for every attempt of the run.

    A retry of the step therefore sends the external system the key it sent before,
    and the ledger finds the earlier record. ``generation`` counts performances after
    a compensation (the undone effect keeps its key; doing it again needs a new one).
    """
    digest = hashlib.sha256(f"{step_id}\x00{tool}".encode()).hexdigest()[:24]
    key = f"{run_id}.{digest}"
    return key if generation == 0 else f"{key}.{generation}"


def compensation_key_for(effect: SideEffect) -> str:
    return f"{effect.idempotency_key}.undo"


def check_supplied_key(key: Any) -> str:
    if (
        not isinstance(key, str)
        or not 1 <= len(key) <= MAX_KEY_LENGTH
        or key != key.strip()
        or not all(" " <= ch <= "~" for ch in key)
    ):
        raise HoldpointError(
            "invalid_input",
            f"idempotency_key must be 1 to {MAX_KEY_LENGTH} printable ASCII characters.",
        )
    return key


def check_text(value: Any, name: str, limit: int, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()) or len(value) > limit:
        raise HoldpointError(
            "invalid_input",
            f"{name} must be {'1' if required else '0'} to {limit:,} characters.",
        )
    return value


def settle_delta() -> dt.timedelta:
    return dt.timedelta(seconds=settings.HOLDPOINT_LEDGER_SETTLE_SECONDS)


def stale_pending_q(*, now: dt.datetime | None = None, lease_now: dt.datetime | None = None) -> Q:
    """Pending effects that no live worker will settle by itself.

    A pending effect is stale when the attempt responsible for it no longer holds a
    live lease (it crashed, was cancelled, or the run moved on), or when it has been
    pending longer than ``HOLDPOINT_LEDGER_SETTLE_SECONDS`` (a worker hung mid-call).
    """
    now = now or timezone.now()
    lease_now = lease_now or db_now()
    return Q(status=SideEffectStatus.PENDING) & (
        ~Q(attempt__status=AttemptStatus.RUNNING)
        | Q(attempt__lease_expires_at__isnull=True)  # no lease at all
        | lease_ran_out_q(lease_now, prefix="attempt__")
        | Q(created_at__lte=now - settle_delta())
    )


def needs_reconciliation_q() -> Q:
    return Q(status=SideEffectStatus.UNKNOWN) | stale_pending_q()


def pending_is_stale(effect: SideEffect) -> bool:
    if effect.status != SideEffectStatus.PENDING:
        return False
    return SideEffect.objects.filter(stale_pending_q(), pk=effect.pk).exists()


def effect_tool(effect: SideEffect) -> Tool:
    """The tool that performed ``effect``: for a remote agent's run, the agent's own
    (``ledger.tools.tool_for_agent``), not a same-named tool of this process or another
    agent's."""
    agent = Run.objects.filter(pk=effect.run_id).values_list("agent", flat=True).first() or ""
    return tool_for_agent(agent, effect.tool)


def lock_effect(operation_id: str) -> tuple[Run, SideEffect]:
    """Lock the run of the side effect, then read the effect: the run row is the lock
    for everything of a run, so outcomes, reconciliations and begins serialise here."""
    run_id = (
        SideEffect.objects.filter(pk=operation_id).values_list("run_id", flat=True).first()
        if isinstance(operation_id, str)
        else None
    )
    if run_id is None:
        raise HoldpointError(
            "not_found", f"There is no side effect {operation_id!r}.", operation_id=operation_id
        )
    run = lock_run(run_id)
    return run, SideEffect.objects.get(pk=operation_id)


def _without_reply_body(error: Any) -> Any:
    # Everyone who may view the run reads its events: what a receiver answered stays on
    # the side effect, where only people who can act see it (ledger.selectors).
    if isinstance(error, dict) and isinstance(error.get("details"), dict):
        details = {k: v for k, v in error["details"].items() if k != "body"}
        return {**error, "details": details}
    return error


def emit(run: Run, type: str, actor: str, effect: SideEffect, **payload: Any) -> None:
    """Append a side-effect event to the run (locked by the caller) and save its seq."""
    if "error" in payload:
        payload["error"] = _without_reply_body(payload["error"])
    append_event(
        run,
        type,
        actor,
        {
            "operation_id": effect.operation_id,
            "step_id": effect.step_id,
            "tool": effect.tool,
            "target": effect.target,
            "status": effect.status,
            **payload,
        },
    )
    run.save(update_fields=["last_event_seq", "updated_at"])


def attempt_is_live(run: Run, attempt: Attempt, *, lease_now: dt.datetime) -> bool:
    """Whether ``attempt``'s worker still holds the run (``runs.leases.worker_holds``)."""
    return worker_holds(run, attempt, lease_now)


def error_dict(error: Any) -> dict[str, Any] | None:
    """Store errors as objects; a bare message becomes ``{"message": …}``."""
    if error is None:
        return None
    if isinstance(error, dict):
        return error
    return {"message": str(error)[:10_000]}
