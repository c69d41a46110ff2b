"""The webhook fan-out demo: one delivery times out, is reconciled, and a retry sends
only what did not happen."""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine
from django.utils import timezone

from ledger import services as ledger
from ledger.models import SideEffect
from runs import services
from runtime.demo_agents.webhook_fanout import agent
from runtime.demo_receiver import DemoReceiver
from runtime.executor import Outcome
from tests.runtime.conftest import fresh, run_next
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver(settings):
    with DemoReceiver() as r:
        settings.HOLDPOINT_WEBHOOK_TIMEOUT_SECONDS = 0.5
        settings.HOLDPOINT_WEBHOOK_LOOKUP_URL = r.lookup_url()
        settings.HOLDPOINT_LEDGER_SETTLE_SECONDS = 1
        yield r


def test_a_timed_out_delivery_is_reconciled_and_nothing_is_sent_twice(receiver) -> None:
    run = services.run_start(
        agent=agent.name,
        input={"base_url": receiver.url, "slow": "analytics", "slow_seconds": 1.0},
    )
    assert run_next(agent) == Outcome.FAILED
    run = fresh(run)
    assert (run.status, run.failure_class) == ("failed", "side_effect_unknown")
    effects = {e.step_id: e for e in SideEffect.objects.filter(run=run)}
    assert {k: e.status for k, e in effects.items()} == {
        "fan_out.notify-billing": "confirmed",
        "fan_out.notify-search": "confirmed",
        "fan_out.notify-analytics": "unknown",
    }
    assert all(e.reversibility == "compensable" for e in effects.values())
    with pytest.raises(Exception, match="reconciled"):
        services.run_retry(run_id=run.id, reason="try again")

    # The slow receiver did get it; after the settle time the reconciler finds out.
    slow_key = effects["fan_out.notify-analytics"].idempotency_key
    wait_for(
        lambda: receiver.book.look_up(slow_key)[0] == 200,
        5,
        "the slow delivery",
        give_up=True,  # the reconciler's look-up below says what it found
    )
    with time_machine.travel(timezone.now() + dt.timedelta(seconds=2)):
        assert ledger.side_effects_look_up_stale() == 1
    assert SideEffect.objects.get(idempotency_key=slow_key).status == "confirmed"

    services.run_retry(run_id=run.id, reason="reconciled")
    assert run_next(agent) == Outcome.SUCCEEDED
    delivered = fresh(run).result["delivered"]
    assert set(delivered) == {"billing", "search", "analytics"}
    # One POST per subscriber: the retry reused every confirmed delivery.
    assert receiver.book.received == 3
    assert len(receiver.book.all()) == 3
