"""A run to draw (issue 30): two attempts that ran, a hold point between them, an unknown
side effect in the second, then a pause; driven through the real services, the way a
worker and people do it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ledger import services as ledger
from runs import services
from runs.models import Run
from runs.services import Lease
from tests.runs.factory import claim, epochs, start


@dataclass
class Scenario:
    run: Run
    first: Lease
    second: Lease
    request_id: str
    unknown_operation: str
    confirmed_operation: str


def effect(lease: Lease, *, step: str, tool: str, target: str, status: str) -> str:
    begun = ledger.side_effect_begin(
        **epochs(lease),
        step_id=step,
        tool=tool,
        target=target,
        request={"url": "http://127.0.0.1:9/x", "body": {}},
    )
    ledger.side_effect_record_outcome(
        operation_id=begun.operation_id,
        status=status,
        lease_epoch=lease.lease_epoch,
        cancel_epoch=lease.cancel_epoch,
    )
    return str(begun.operation_id)


def two_attempts_hold_pause_unknown(
    *, answerer: Any, pauser: Any, gap: float = 0.0, prompt: str = "Which versions stay?"
) -> Scenario:
    """``gap`` seconds between the scenes, so a drawing shows each at a visible width."""
    run = start(approvals=["fetch", "deploy", "notify"])
    first = claim()
    services.checkpoint_save(**epochs(first), step="fetch", state={"i": 1})
    time.sleep(gap)
    confirmed = effect(
        first, step="fetch", tool="webhook", target="deploy-hook", status="confirmed"
    )
    cp = services.checkpoint_save(**epochs(first), step="ask", state={"i": 2})
    time.sleep(gap)
    request = services.attempt_interrupt(
        **epochs(first),
        checkpoint_id=cp.id,
        kind="input_required",
        prompt=prompt,
        accepted_schema={"versions": "string[]"},
        expires_in=3600,
    )
    time.sleep(gap * 2)
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=cp.id,
        value={"versions": ["v1"]},
        user=answerer,
    )
    time.sleep(gap)
    second = claim()
    services.checkpoint_save(**epochs(second), step="deploy", state={"i": 3})
    time.sleep(gap)
    unknown = effect(second, step="deploy", tool="webhook", target="release-hook", status="unknown")
    time.sleep(gap)
    services.run_pause(run_id=run.id, reason="look at the unknown effect", user=pauser)
    services.checkpoint_save(**epochs(second), step="verify", state={"i": 4})
    services.attempt_release(
        attempt_id=second.attempt_id, lease_epoch=second.lease_epoch, reason="paused"
    )
    run.refresh_from_db()
    assert run.status == "paused", run.status
    return Scenario(run, first, second, str(request.id), unknown, confirmed)
