"""side_effect_compensate: intent committed first, the tool outside the transaction,
the outcome recorded; its own idempotency key makes a second try harmless."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.tools.config_store import ConfigStore
from runs.errors import HoldpointError
from tests.ledger.conftest import Receiver
from tests.ledger.helpers import event_types, hook, perform
from tests.runs.factory import claim, start

pytestmark = pytest.mark.django_db


def write(lease: Any, step: str, content: Any) -> SideEffect:
    done = perform(
        lease,
        step=step,
        tool="config_store",
        target="staging/auth/config",
        request={"document": "staging/auth/config", "content": content},
    )
    assert done.side_effect.status == "confirmed"
    return done.side_effect


def test_it_restores_the_previous_config_version(config_dir: Path, operator: Any) -> None:
    run = start()
    lease = claim()
    write(lease, "seed", {"ttl": 60})
    effect = write(lease, "shorten", {"ttl": 5})
    assert effect.compensating_action["restore_version"] == 1
    undone = ledger.side_effect_compensate(operation_id=effect.operation_id, user=operator)
    assert undone.status == "compensated"
    assert undone.compensation_idempotency_key == effect.idempotency_key + ".undo"
    assert undone.compensation_reference == "staging/auth/config@v3"
    assert undone.compensation_actor == "user:olivia" and undone.compensated_by == operator
    assert undone.compensation_ended_at is not None and not undone.compensation_in_progress
    latest = ConfigStore(config_dir).read("staging/auth/config")
    assert (latest.version, latest.content, latest.restored_from) == (3, {"ttl": 60}, 1)
    assert event_types(run.id)[-2:] == [
        "side_effect.compensation_started",
        "side_effect.compensated",
    ]


def test_an_irreversible_effect_cannot_be_compensated(operator: Any, mailbox: list[Any]) -> None:
    start(approvals=["announce"])
    done = perform(
        claim(),
        step="announce",
        tool="email",
        target="ops@example.com",
        request={"to": "ops@example.com", "subject": "s"},
    )
    with pytest.raises(HoldpointError) as exc:
        ledger.side_effect_compensate(operation_id=done.side_effect.operation_id, user=operator)
    assert exc.value.code == "invalid_state"
    assert SideEffect.objects.get(pk=done.side_effect.operation_id).status == "confirmed"


def test_only_an_effect_that_happened_can_be_compensated(config_dir: Path, operator: Any) -> None:
    start()
    lease = claim()
    effect = write(lease, "seed", {"a": 1})
    ledger.side_effect_compensate(operation_id=effect.operation_id, user=operator)
    with pytest.raises(HoldpointError) as exc:
        ledger.side_effect_compensate(operation_id=effect.operation_id, user=operator)
    assert exc.value.code == "invalid_state"
    assert ConfigStore(config_dir).versions("staging/auth/config") == [1, 2]


def test_a_failed_compensation_is_recorded_and_may_be_tried_again(
    receiver: Receiver, operator: Any
) -> None:
    start()
    lease = claim()
    done = perform(
        lease,
        request=hook(receiver),
        reversibility="compensable",
        compensating_action={"url": receiver.url("/hooks/rollback"), "body": {"undo": True}},
    )
    receiver.mode = "reject"
    failed = ledger.side_effect_compensate(operation_id=done.side_effect.operation_id)
    assert failed.status == "compensation_failed"
    assert failed.compensation_error["details"]["status"] == 422
    receiver.mode = "ok"
    undone = ledger.side_effect_compensate(operation_id=done.side_effect.operation_id)
    assert undone.status == "compensated" and undone.compensation_error is None
    key = undone.compensation_idempotency_key
    assert receiver.received[key] == 2 and receiver.performed[key] == 1


def test_an_unknown_compensation_is_a_failed_one_that_says_so(
    receiver: Receiver,
) -> None:
    start()
    done = perform(
        claim(),
        request=hook(receiver),
        reversibility="compensable",
        compensating_action={"url": receiver.url("/hooks/rollback")},
    )
    receiver.mode = "slow"
    result = ledger.side_effect_compensate(operation_id=done.side_effect.operation_id)
    assert result.status == "compensation_failed"
    assert result.compensation_error["outcome_unknown"] is True
    # The receiver finishes it; trying again with the same key does not undo it twice.
    receiver.wait_performed(result.compensation_idempotency_key)
    receiver.mode = "ok"
    again = ledger.side_effect_compensate(operation_id=done.side_effect.operation_id)
    assert again.status == "compensated"
    assert receiver.performed[result.compensation_idempotency_key] == 1


def test_a_compensation_in_progress_refuses_a_second_until_it_has_had_its_time(
    config_dir: Path, operator: Any, settings: Any
) -> None:
    settings.HOLDPOINT_LEDGER_SETTLE_SECONDS = 60
    start()
    effect = write(claim(), "seed", {"a": 1})
    # A compensation whose process died after writing its intent.
    SideEffect.objects.filter(pk=effect.pk).update(
        compensation_idempotency_key=effect.idempotency_key + ".undo",
        compensation_started_at=timezone.now(),
        compensation_actor="user:someone",
    )
    with pytest.raises(HoldpointError) as exc:
        ledger.side_effect_compensate(operation_id=effect.operation_id, user=operator)
    assert exc.value.code == "invalid_state" and "in progress" in exc.value.detail
    with time_machine.travel(timezone.now() + dt.timedelta(seconds=61)):
        undone = ledger.side_effect_compensate(operation_id=effect.operation_id, user=operator)
    assert undone.status == "compensated"
