"""The Python worker renews all the attempts of its process in one batch
(``POST /api/worker/heartbeat``, ``holdpoint_client.remote.HeartbeatPool``), against a live
server process: leases are kept for many lease lengths with no watch per attempt, and a
cancel of one attempt reaches its step at once while the others go on.
"""

from __future__ import annotations

import threading

import pytest

from runs import services
from runs.models import Attempt, RunEvent
from tests.clients.conftest import wait_for, wait_status

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_one_batch_keeps_every_lease_of_the_process(worker, operator) -> None:
    w = worker(concurrency=3)
    # Each run outlives its lease several times over (15 steps of 0.5 s, a 3 s lease).
    run_ids = [
        services.run_start(agent="remote-loop", input={"steps": 15, "pause": 0.5}, user=operator).id
        for _ in range(3)
    ]
    for run_id in run_ids:
        wait_status(run_id, "succeeded", timeout=60)
    assert not RunEvent.objects.filter(run_id__in=run_ids, type="attempt.lost").exists()
    assert {Attempt.objects.filter(run_id=r).count() for r in run_ids} == {1}
    # The batch was used: the pool never fell back to a watch per attempt.
    assert w.heartbeats._legacy is None


def test_a_cancel_reaches_one_attempt_of_the_batch_at_once(worker, operator) -> None:
    # A 60 s lease: renewals every 20 s, each batch held 10 s. The cancel arrives through the
    # server's NOTIFY to the held batch, long before the next renewal.
    w = worker(concurrency=2, lease_seconds=60)
    first, second = (
        services.run_start(agent="remote-loop", input={"pause": 30}, user=operator).id
        for _ in range(2)
    )
    wait_status(first, "running")
    wait_status(second, "running")
    wait_for(lambda: len(w.active_attempts()) == 2, 10, "the worker to hold both attempts")
    threading.Event().wait(1.0)  # the batch is held now
    services.run_cancel(run_id=first, user=operator, reason="now")
    wait_status(first, "cancelled", timeout=10)
    wait_status(second, "running")
    assert Attempt.objects.filter(run_id=second).count() == 1
