"""The ledger's promises end to end, with a real webhook receiver and the run services:
a crash between act and record, a timeout that stops the run until reconciled, an
irreversible action held for approval, a late outcome from a stale worker."""

from __future__ import annotations

from typing import Any

import pytest

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.selectors import report_for_run
from ledger.tools import get_tool
from runs import services
from runs.errors import HoldpointError
from runs.models import Run
from tests.ledger.conftest import Receiver
from tests.ledger.helpers import begin, crash, event_types, fail_unknown, hook, perform
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db


def test_a_crash_between_act_and_record_does_not_act_twice(receiver: Receiver) -> None:
    run = start(approvals=["deploy"])
    lease = claim("w1")
    answer = begin(lease, step="deploy", request=hook(receiver))
    assert answer.decision == "act"
    # The worker acts with the key the ledger gave it...
    get_tool("webhook").execute(hook(receiver), answer.idempotency_key)
    # ...and dies before it can record the outcome. Another worker takes over.
    lease2 = crash(lease, "w2")
    assert lease2.reason == "lease_expired"
    done = perform(lease2, step="deploy", request=hook(receiver))
    assert (done.decision, done.acted) == ("look_up", False)
    effect = done.side_effect
    assert (effect.status, effect.external_reference) == ("confirmed", "dlv_1")
    assert effect.outcome_actor == "worker:w2" and effect.late is False
    # The receiver saw exactly one delivery, and no second POST at all.
    assert receiver.performed[answer.idempotency_key] == 1
    assert receiver.received[answer.idempotency_key] == 1
    assert receiver.lookups[answer.idempotency_key] == 1
    assert event_types(run.id) == [
        "side_effect.begun",
        "side_effect.look_up",
        "side_effect.confirmed",
    ]


def test_a_crash_before_the_act_looks_up_then_acts_once(receiver: Receiver) -> None:
    start(approvals=["deploy"])
    lease = claim("w1")
    answer = begin(lease, step="deploy", request=hook(receiver))
    lease2 = crash(lease, "w2")
    done = perform(lease2, step="deploy", request=hook(receiver))
    assert (done.decision, done.acted, done.side_effect.status) == ("look_up", True, "confirmed")
    assert receiver.lookups[answer.idempotency_key] == 1
    assert receiver.performed[answer.idempotency_key] == 1


def test_a_timeout_becomes_unknown_and_stops_retries_until_reconciled(
    receiver: Receiver, operator: Any
) -> None:
    receiver.mode = "slow"
    run = start(approvals=["deploy"])
    lease = claim()
    done = perform(lease, step="deploy", request=hook(receiver))
    effect = done.side_effect
    assert (done.acted, effect.status) == (True, "unknown")
    assert effect.error["type"] == "OutcomeUnknown"
    fail_unknown(lease, effect)
    run.refresh_from_db()
    # No automatic retry: the run stops, and nothing is queued.
    assert (run.status, run.failure_class) == ("failed", "side_effect_unknown")
    assert services.attempt_claim(worker_id="w9") is None
    # Nor may a person retry before the effect is settled.
    with pytest.raises(HoldpointError) as exc:
        services.run_retry(run_id=run.id, reason="try again", user=operator)
    assert exc.value.code == "retry_not_allowed"
    assert "outcome is unknown" in exc.value.detail
    assert any("reconciled" in r for r in services.retry_blockers(run))
    # The slow receiver did the work after all; a person checks and says so.
    receiver.wait_performed(effect.idempotency_key)
    ledger.side_effect_reconcile(
        operation_id=effect.operation_id,
        outcome="confirmed",
        external_reference="dlv_1",
        note="The receiver's log shows dlv_1 at 14:02.",
        user=operator,
    )
    assert services.retry_blockers(Run.objects.get(pk=run.id)) == []
    services.run_retry(run_id=run.id, reason="reconciled", user=operator)
    lease2 = claim("w2")
    again = perform(lease2, step="deploy", request=hook(receiver))
    assert (again.decision, again.acted) == ("reuse", False)
    assert again.side_effect.external_reference == "dlv_1"
    assert receiver.received[effect.idempotency_key] == 1
    assert receiver.performed[effect.idempotency_key] == 1


def test_a_failed_effect_is_done_again_with_the_same_key(receiver: Receiver, operator: Any) -> None:
    receiver.mode = "reject"  # the first call fails definitely...
    run = start(approvals=["deploy"])
    lease = claim()
    first = perform(lease, step="deploy", request=hook(receiver))
    assert first.side_effect.status == "failed"
    # ...and a failed effect is simply tried again: no person needed.
    receiver.mode = "ok"
    second = perform(lease, step="deploy", request=hook(receiver))
    assert (second.decision, second.acted, second.side_effect.status) == ("act", True, "confirmed")
    assert second.side_effect.operation_id == first.side_effect.operation_id
    assert receiver.received[first.side_effect.idempotency_key] == 2
    assert receiver.performed[first.side_effect.idempotency_key] == 1
    assert Run.objects.get(pk=run.id).status == "running"


def test_an_irreversible_action_is_held_for_approval(approver: Any, mailbox: list[Any]) -> None:
    run = start()
    lease = claim("w1")
    checkpoint = services.checkpoint_save(**epochs(lease), step="announce", state={})
    mail = {"to": "ops@example.com", "subject": "Token v2 is live", "body": "Rotated."}
    with pytest.raises(HoldpointError) as exc:
        perform(lease, step="announce", tool="email", target="ops@example.com", request=mail)
    assert exc.value.code == "approval_required"
    assert mailbox == [] and not SideEffect.objects.exists()
    # The runtime turns that into an approval hold point...
    request = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=checkpoint.id,
        kind="auth_required",
        prompt="Send the announcement to ops@example.com?",
        step_id="announce",
        # What the approver sees, and all the approval covers: tool, target and request.
        action={
            "tool": "email",
            "target": "ops@example.com",
            "change": mail,
            "reversibility": "irreversible",
        },
    )
    # ...a person approves, and the next attempt may act.
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=checkpoint.id,
        value={"decision": "approve", "comment": "Go ahead"},
        user=approver,
    )
    lease2 = claim("w2")
    done = perform(lease2, step="announce", tool="email", target="ops@example.com", request=mail)
    assert (done.acted, done.side_effect.status) == (True, "confirmed")
    assert len(mailbox) == 1
    assert done.side_effect.approval["by"] == "alice"
    assert done.side_effect.approval["request_id"] == request.id
    row = report_for_run(run.id)["groups"][1]["rows"][0]
    assert (row["approved_by"], row["approval_comment"]) == ("alice", "Go ahead")
    # A retry of the step never sends it twice.
    again = perform(lease2, step="announce", tool="email", target="ops@example.com", request=mail)
    assert (again.decision, again.acted) == ("reuse", False) and len(mailbox) == 1


def test_a_denied_action_stays_refused(approver: Any, mailbox: list[Any]) -> None:
    run = start()
    lease = claim("w1")
    checkpoint = services.checkpoint_save(**epochs(lease), step="announce", state={})
    request = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=checkpoint.id,
        kind="auth_required",
        prompt="Send it?",
        step_id="announce",
        action={
            "tool": "email",
            "target": "ops@example.com",
            "change": {"to": "ops@example.com", "subject": "s"},
        },
    )
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=checkpoint.id,
        value={"decision": "deny", "comment": "Wrong list"},
        user=approver,
    )
    lease2 = claim("w2")
    with pytest.raises(HoldpointError) as exc:
        perform(
            lease2,
            step="announce",
            tool="email",
            target="ops@example.com",
            request={"to": "ops@example.com", "subject": "s"},
        )
    assert exc.value.code == "approval_required"
    assert exc.value.extra["denied_by"] == "alice"
    assert mailbox == []


def test_a_late_outcome_from_a_stale_worker_is_recorded_flagged_and_reused(
    receiver: Receiver,
) -> None:
    run = start(approvals=["deploy"])
    old = claim("w1")
    answer = begin(old, step="deploy", request=hook(receiver))
    # w1 hangs in the call long enough to lose its lease; w2 takes the run over.
    new = crash(old, "w2")
    done = get_tool("webhook").execute(hook(receiver), answer.idempotency_key)
    effect = ledger.side_effect_record_outcome(
        operation_id=answer.operation_id,
        status="confirmed",
        external_reference=done.external_reference,
        result=done.result,
        lease_epoch=old.lease_epoch,
        cancel_epoch=old.cancel_epoch,
    )
    assert (effect.status, effect.late, effect.outcome_actor) == ("confirmed", True, "worker:w1")
    assert event_types(run.id)[-1] == "side_effect.late_outcome"
    # w1 itself is fenced for everything else it tries...
    with pytest.raises(HoldpointError) as exc:
        services.attempt_complete(**epochs(old), result={})
    assert exc.value.code == "stale_worker"
    # ...and w2, reaching the step, reuses the fact instead of acting again.
    again = perform(new, step="deploy", request=hook(receiver))
    assert (again.decision, again.acted) == ("reuse", False)
    assert receiver.received[answer.idempotency_key] == 1
