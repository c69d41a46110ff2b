"""The reconciler sweep: it asks tools about keys nobody else will settle."""

from __future__ import annotations

import datetime as dt
import socket
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.tools import get_tool
from runs import services
from tests.ledger.conftest import Receiver
from tests.ledger.helpers import begin, fail_unknown, hook, lose_lease, perform
from tests.runs.factory import claim, start

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _settle(settings: Any) -> None:
    settings.HOLDPOINT_LEDGER_SETTLE_SECONDS = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def later(seconds: float = 61) -> Any:
    return time_machine.travel(timezone.now() + dt.timedelta(seconds=seconds))


def test_it_is_part_of_sweep_all() -> None:
    assert services.sweep_all().other["side_effects"] == 0


def test_a_pending_effect_whose_worker_died_after_acting_is_confirmed(
    receiver: Receiver,
) -> None:
    start(approvals=["deploy"])
    lease = claim()
    answer = begin(lease, step="deploy", request=hook(receiver))
    get_tool("webhook").execute(hook(receiver), answer.idempotency_key)
    lose_lease(lease)  # the worker is gone; the run waits for its next attempt
    assert services.sweep_all().other["side_effects"] == 1
    effect = SideEffect.objects.get(pk=answer.operation_id)
    assert (effect.status, effect.external_reference) == ("confirmed", "dlv_1")
    assert effect.outcome_actor == "system:reconciler"
    assert receiver.performed[answer.idempotency_key] == 1


def test_a_pending_effect_the_receiver_never_saw_did_not_happen(receiver: Receiver) -> None:
    start(approvals=["deploy"])
    lease = claim()
    answer = begin(lease, step="deploy", request=hook(receiver))
    lose_lease(lease)
    assert ledger.side_effects_look_up_stale() == 1
    effect = SideEffect.objects.get(pk=answer.operation_id)
    assert effect.status == "failed" and effect.error["type"] == "NotFound"
    # The next attempt does it, with the same key.
    again = perform(claim("w2"), step="deploy", request=hook(receiver))
    assert (again.decision, again.side_effect.status) == ("act", "confirmed")
    assert receiver.performed[answer.idempotency_key] == 1


def test_a_pending_effect_of_a_live_worker_is_left_alone_until_it_is_overdue(
    receiver: Receiver,
) -> None:
    start(approvals=["deploy"])
    lease = claim(lease_seconds=3600)
    answer = begin(lease, step="deploy", request=hook(receiver))
    assert ledger.side_effects_look_up_stale() == 0
    assert receiver.lookups[answer.idempotency_key] == 0
    with later():
        assert ledger.side_effects_look_up_stale() == 1
    assert SideEffect.objects.get(pk=answer.operation_id).status == "failed"


def test_an_unknown_effect_is_looked_up_once_it_has_settled(
    receiver: Receiver, operator: Any
) -> None:
    receiver.mode = "slow"
    run = start(approvals=["deploy"])
    lease = claim()
    done = perform(lease, step="deploy", request=hook(receiver))
    fail_unknown(lease, done.side_effect)
    receiver.wait_performed(done.side_effect.idempotency_key)
    # Too soon: a slow receiver may still be working on it.
    assert ledger.side_effects_look_up_stale() == 0
    with later():
        assert ledger.side_effects_look_up_stale() == 1
    effect = SideEffect.objects.get(pk=done.side_effect.operation_id)
    assert (effect.status, effect.external_reference) == ("confirmed", "dlv_1")
    assert effect.outcome_actor == "system:reconciler"
    # Settled: the run may be retried, and the retry reuses the result.
    services.run_retry(run_id=run.id, reason="the reconciler settled it", user=operator)
    again = perform(claim("w2"), step="deploy", request=hook(receiver))
    assert (again.decision, again.acted) == ("reuse", False)


def test_it_asks_about_a_key_once_per_settle_period(receiver: Receiver, settings: Any) -> None:
    # A lookup service that cannot be reached: the answer stays "cannot tell".
    settings.HOLDPOINT_WEBHOOK_LOOKUP_URL = f"http://127.0.0.1:{free_port()}/{{idempotency_key}}"
    start(approvals=["deploy"])
    lease = claim()
    answer = begin(lease, step="deploy", request=hook(receiver))
    lose_lease(lease)
    assert ledger.side_effects_look_up_stale() == 0
    first = SideEffect.objects.get(pk=answer.operation_id)
    assert first.status == "pending" and first.looked_up_at is not None
    assert ledger.side_effects_look_up_stale() == 0
    assert SideEffect.objects.get(pk=answer.operation_id).looked_up_at == first.looked_up_at
    with later():
        ledger.side_effects_look_up_stale()
        assert SideEffect.objects.get(pk=answer.operation_id).looked_up_at > first.looked_up_at


def test_it_never_asks_a_tool_that_cannot_tell(mailbox: list[Any]) -> None:
    start(approvals=["announce"])
    lease = claim()
    answer = begin(
        lease,
        step="announce",
        tool="email",
        target="ops@example.com",
        request={"to": "ops@example.com", "subject": "s"},
    )
    lose_lease(lease)
    with later():
        assert ledger.side_effects_look_up_stale() == 0
    effect = SideEffect.objects.get(pk=answer.operation_id)
    assert effect.status == "pending" and effect.looked_up_at is None
