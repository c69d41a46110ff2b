"""The reconciler: a sweep that asks tools about unsettled keys and records the answer.

It looks at effects nobody else will settle: ``pending`` ones whose worker is gone
(or hung past the settle time), and ``unknown`` ones that have been unknown for the
settle time (a slow receiver may still have been working when the call timed out).
Each candidate is claimed with a compare-and-set on ``looked_up_at``, so any
number of sweepers run at once and ask about each key once per settle period;
tools that can never tell (e-mail) are not asked.
"""

from __future__ import annotations

import logging

from django.db.models import Q
from django.utils import timezone

from ledger.models import SideEffect, SideEffectStatus
from ledger.services._common import effect_tool, settle_delta, stale_pending_q
from ledger.services.outcomes import side_effect_record_outcome
from ledger.tools import OutcomeUnknown, can_look_up, registered_tools
from runs.errors import HoldpointError
from runs.services import agents_declaring_tool

logger = logging.getLogger(__name__)

S = SideEffectStatus
ACTOR = "system:reconciler"


def side_effects_look_up_stale(*, limit: int = 100) -> int:
    """Look up unsettled effects by idempotency key; return how many got settled."""
    now = timezone.now()
    settled_before = now - settle_delta()
    askable = [tool.name for tool in registered_tools() if can_look_up(tool)]
    unsettled = SideEffect.objects.filter(
        stale_pending_q(now=now)
        | Q(status=S.UNKNOWN, outcome_at__lte=settled_before)
        | Q(status=S.UNKNOWN, outcome_at__isnull=True),
        tool__in=askable,
    )
    # A remote agent's tool of the same name as one registered here is not this tool: its
    # effects were performed in the agent's process, and only that process can look them
    # up (its next attempt does). Asking the tool here would hear "no record" of an act
    # that happened, record it failed, and let the next attempt act again.
    for name in askable:
        agents = agents_declaring_tool(name)
        if agents:
            unsettled = unsettled.exclude(tool=name, run__agent__in=agents)
    # side_effect_unsettled_idx serves this: status IN ('pending','unknown') ORDER BY created_at.
    candidates = list(
        unsettled.filter(
            Q(looked_up_at__isnull=True) | Q(looked_up_at__lte=settled_before)
        ).order_by("created_at")[:limit]
    )
    settled = 0
    for effect in candidates:
        claimed = SideEffect.objects.filter(
            pk=effect.pk, looked_up_at=effect.looked_up_at, status=effect.status
        ).update(looked_up_at=now)
        if claimed != 1:
            continue  # Another sweeper has it, or it was settled meanwhile.
        try:
            if _look_up_one(effect):
                settled += 1
        except HoldpointError as exc:
            # Settled meanwhile by a person or a worker: their word stands.
            logger.info("reconciler: %s left as it is: %s", effect.operation_id, exc.detail)
    return settled


def _look_up_one(effect: SideEffect) -> bool:
    """Record what the tool knows about the key, as a fact reported by the reconciler.

    No record: the receiver never saw the key (its worker is gone, or the settle time
    has passed since a timeout), so it did not happen, and a retry may act again with
    the same key.
    """
    tool = effect_tool(effect)
    if not can_look_up(tool):
        return False  # Declared by a remote agent meanwhile: its next attempt looks up.
    try:
        outcome = tool.lookup(effect.idempotency_key)
    except OutcomeUnknown as exc:
        logger.info("reconciler: %s still cannot be told: %s", effect.operation_id, exc.message)
        return False
    except Exception:
        # A tool's own bug (an agent author's code) is "cannot tell" for this key, and the
        # sweep goes on with the other keys; it asks again after the settle time.
        logger.exception(
            "reconciler: %s: the %s tool's look-up failed", effect.operation_id, tool.name
        )
        return False
    if outcome is None:
        side_effect_record_outcome(
            operation_id=effect.operation_id,
            status=S.FAILED,
            error={
                "type": "NotFound",
                "message": f"The {tool.name} tool has no record of this key.",
            },
            actor=ACTOR,
        )
    else:
        side_effect_record_outcome(
            operation_id=effect.operation_id,
            status=outcome.status,
            external_reference=outcome.external_reference or None,
            result=outcome.result,
            error=outcome.error,
            actor=ACTOR,
        )
    return True
