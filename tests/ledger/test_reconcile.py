"""side_effect_reconcile and the retry guard: unsettled effects block a retry until a
person (or the reconciler) says what happened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.selectors import side_effects_needing_reconciliation
from runs import services
from runs.errors import HoldpointError
from tests.ledger.conftest import Receiver
from tests.ledger.helpers import begin, crash, events, fail_unknown, hook, lose_lease, perform
from tests.runs.factory import claim, start

pytestmark = pytest.mark.django_db

CONFIG = {"document": "app", "content": {"a": 1}}


def unknown_effect(lease: Any) -> SideEffect:
    op = begin(lease, tool="config_store", target="app", request=CONFIG).operation_id
    return ledger.side_effect_record_outcome(operation_id=op, status="unknown", error="timeout")


def test_it_settles_an_unknown_as_confirmed_with_who_and_why(
    config_dir: Path, operator: Any
) -> None:
    run = start()
    lease = claim()
    effect = unknown_effect(lease)
    settled = ledger.side_effect_reconcile(
        operation_id=effect.operation_id,
        outcome="confirmed",
        external_reference="app@v1",
        note="Version 1 is on disk.",
        user=operator,
    )
    assert (settled.status, settled.resolution, settled.external_reference) == (
        "confirmed",
        "confirmed",
        "app@v1",
    )
    assert (settled.resolved_by, settled.resolved_actor) == (operator, "user:olivia")
    assert settled.resolution_note == "Version 1 is on disk." and settled.resolved_at is not None
    kind, payload = events(run.id)[-1]
    assert kind == "side_effect.reconciled"
    assert payload["outcome"] == "confirmed" and payload["previous_status"] == "unknown"


def test_not_applied_lets_a_retry_act_again_and_the_key_keeps_it_single(
    receiver: Receiver, operator: Any
) -> None:
    receiver.mode = "slow"
    run = start(approvals=["deploy"])
    lease = claim()
    done = perform(lease, step="deploy", request=hook(receiver))
    fail_unknown(lease, done.side_effect)
    # The person is wrong: the slow receiver did do it.
    ledger.side_effect_reconcile(
        operation_id=done.side_effect.operation_id,
        outcome="not_applied",
        note="Nothing in the receiver's dashboard.",
        user=operator,
    )
    receiver.wait_performed(done.side_effect.idempotency_key)
    receiver.mode = "ok"
    services.run_retry(run_id=run.id, reason="reconciled", user=operator)
    again = perform(claim("w2"), step="deploy", request=hook(receiver))
    assert (again.decision, again.acted, again.side_effect.status) == ("act", True, "confirmed")
    # The same key went out again, and the receiver recognised it: still one delivery.
    assert receiver.received[done.side_effect.idempotency_key] == 2
    assert receiver.performed[done.side_effect.idempotency_key] == 1


def test_a_pending_effect_of_a_live_worker_cannot_be_reconciled(config_dir: Path) -> None:
    start()
    lease = claim()
    op = begin(lease, tool="config_store", target="app", request=CONFIG).operation_id
    with pytest.raises(HoldpointError) as exc:
        ledger.side_effect_reconcile(operation_id=op, outcome="confirmed", note="sure")
    assert exc.value.code == "invalid_state"
    assert SideEffect.objects.get(pk=op).status == "pending"


def test_a_pending_effect_whose_worker_is_gone_blocks_retry_and_can_be_reconciled(
    config_dir: Path, operator: Any
) -> None:
    run = start()
    lease = claim()
    op = begin(lease, tool="config_store", target="app", request=CONFIG).operation_id
    lose_lease(crash(lease))  # the test agent allows two lost leases in a row
    run.refresh_from_db()
    assert (run.status, run.failure_class) == ("failed", "lease_lost")
    assert [e.operation_id for e in side_effects_needing_reconciliation()] == [op]
    with pytest.raises(HoldpointError) as exc:
        services.run_retry(run_id=run.id, reason="again", user=operator)
    assert exc.value.code == "retry_not_allowed"
    assert "left pending by a worker that is gone" in exc.value.detail
    ledger.side_effect_reconcile(
        operation_id=op, outcome="not_applied", note="No version 1 on disk.", user=operator
    )
    assert list(side_effects_needing_reconciliation()) == []
    services.run_retry(run_id=run.id, reason="again", user=operator)


def test_a_settled_effect_cannot_be_reconciled_again(config_dir: Path, operator: Any) -> None:
    start()
    lease = claim()
    effect = unknown_effect(lease)
    ledger.side_effect_reconcile(
        operation_id=effect.operation_id, outcome="not_applied", note="checked", user=operator
    )
    with pytest.raises(HoldpointError) as exc:
        ledger.side_effect_reconcile(
            operation_id=effect.operation_id, outcome="confirmed", note="no, it did", user=operator
        )
    assert exc.value.code == "invalid_state"
    assert exc.value.detail.startswith("Already reconciled as not_applied by user:olivia at ")


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"outcome": "maybe", "note": "x"}, "invalid_input"),
        ({"outcome": "confirmed", "note": ""}, "invalid_input"),
        ({"outcome": "confirmed", "note": "   "}, "invalid_input"),
        ({"outcome": "confirmed", "note": "x", "external_reference": "r" * 501}, "invalid_input"),
        ({"operation_id": "op_nope", "outcome": "confirmed", "note": "x"}, "not_found"),
    ],
)
def test_it_refuses_a_bad_reconciliation(kwargs: dict, code: str, config_dir: Path) -> None:
    start()
    effect = unknown_effect(claim())
    kwargs.setdefault("operation_id", effect.operation_id)
    with pytest.raises(HoldpointError) as exc:
        ledger.side_effect_reconcile(**kwargs)
    assert exc.value.code == code
    assert SideEffect.objects.get(pk=effect.operation_id).status == "unknown"
