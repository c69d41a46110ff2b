"""The worker cycle in few round trips, and what the fence reads with its lock held.

The fence (``lock_for_worker_write``) sends the run's lock and the attempt's read in one
round trip on PostgreSQL: two statements, the second started after the first holds the
lock. A write that waited on the lock must judge the attempt as the lock's previous holder
left it, not as it was when the locking statement began (a row joined in the locking
statement would be that older version). The claim's SQL is compiled once per shape; a
claim restricted to other agents must not reuse another shape's SQL.
"""

from __future__ import annotations

import threading

import pytest
from django.db import close_old_connections, connection, transaction
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.errors import HoldpointError
from runs.models import Attempt, Checkpoint
from runs.services._base import lock_run
from runs.states import AttemptStatus
from tests.runs.factory import claim, epochs, start
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_cycle_takes_two_or_three_round_trips_a_call_and_numbers_its_checkpoints() -> None:
    start()
    with CaptureQueriesContext(connection) as queries:
        lease = claim()
        services.checkpoint_save(**epochs(lease), step="a", state={"i": 1})
        second = services.checkpoint_save(**epochs(lease), step="b", state={"i": 2})
        services.attempt_complete(**epochs(lease), result={"ok": True})
    sql = [q["sql"] for q in queries]
    # One transaction a call; in it, the claim: the locked SELECT, the gate with the
    # attempt, the write; a checkpoint and the completion: the lock with the attempt (and
    # the number), the write.
    assert sql.count("BEGIN") == sql.count("COMMIT") == 4, sql
    statements = [s for s in sql if s not in ("BEGIN", "COMMIT")]
    assert len(statements) == 3 + 2 + 2 + 2, [s[:80] for s in statements]
    assert second.number == 2
    assert list(Checkpoint.objects.order_by("number").values_list("step", flat=True)) == [
        "a",
        "b",
    ]


def test_the_fence_judges_the_attempt_as_the_previous_lock_holder_left_it() -> None:
    run = start()
    lease = claim()
    holding = threading.Event()
    release = threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                lock_run(run.id)
                # Changed under the run lock, committed only after the write below waits.
                Attempt.objects.filter(pk=lease.attempt_id).update(status=AttemptStatus.FAILED)
                holding.set()
                assert release.wait(60)
        finally:
            close_old_connections()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert holding.wait(60)
        outcome: list[object] = []

        def write() -> None:
            try:
                services.checkpoint_save(**epochs(lease), step="late", state={})
                outcome.append("saved")
            except HoldpointError as exc:
                outcome.append(exc.code)
            finally:
                close_old_connections()

        writer = threading.Thread(target=write)
        writer.start()
        # The writer is waiting on the run's lock (not merely not yet started).
        wait_for(_waits_on_a_lock, 60, "the write to wait on the run's lock")
        release.set()
        writer.join(60)
        assert outcome == ["stale_worker"]
    finally:
        release.set()
        thread.join(60)
    assert not Checkpoint.objects.filter(step="late").exists()


def _waits_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        (count,) = cursor.fetchone()
    return bool(count)


def test_a_claim_scoped_to_other_agents_does_not_take_this_agents_run() -> None:
    start()
    assert services.attempt_claim(worker_id="w1", agents=["someone-else"]) is None
    lease = services.attempt_claim(worker_id="w1", agents=["test-agent"])
    assert lease is not None
