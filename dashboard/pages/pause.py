"""What the run page shows about pausing (the page and its live socket share it)."""

from __future__ import annotations

from typing import Any

from dashboard.actions import new_idempotency_key
from dashboard.present import actor_name, clock
from runs.access import Actor
from runs.models import InputRequest, Run
from runs.selectors import CANCEL
from runs.states import PAUSABLE, RequestKind, RunStatus


def pause_context(run: Run, user: Actor) -> dict[str, Any]:
    """What the run page shows about pausing: the Pause form, or who paused, why and since
    when with Continue (a breakpoint names the step it stopped before)."""
    paused: dict[str, Any] | None = None
    if run.status == RunStatus.PAUSED and run.pending_request_id:
        request = InputRequest.objects.filter(
            pk=run.pending_request_id, kind=RequestKind.PAUSE
        ).first()
        if request is not None:
            context = request.context or {}
            paused = {
                "state": "paused",
                "who": actor_name(str(context.get("paused_by") or "")),
                "why": request.prompt,
                "since": clock(request.created_at),
                "step": context.get("step") or "",
                "breakpoint": context.get("breakpoint") or "",
                "request_id": request.id,
                "checkpoint_id": request.checkpoint_id or "",
                "expires": clock(request.expires_at) if context.get("expires") else "",
            }
    elif run.status == RunStatus.PAUSE_REQUESTED:
        paused = {
            "state": "pause_requested",
            "who": actor_name(run.pause_actor),
            "why": run.pause_reason,
            "since": clock(run.pause_requested_at),
        }
    may = user.has_perm(CANCEL)
    return {
        "paused": paused,
        "pausable": run.status in PAUSABLE,
        "can_pause": may,
        "pause_key": new_idempotency_key(),
        "continue_key": new_idempotency_key(),
    }
