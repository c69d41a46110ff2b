"""Races on real PostgreSQL: threads behind a barrier run the same operation at once.

Each race repeats 50 times with fresh runs. Exactly one side wins; the loser gets a
clear error and changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from runs import services
from runs.errors import HoldpointError
from runs.models import Attempt, Run
from tests.runs.factory import claim, epochs, interrupted, start

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROUNDS = 50


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` in threads released together; return each result or exception."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def target(i: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[i] = call()
        except Exception as exc:  # collected and asserted on by the test
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=target, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_two_claimers_get_one_lease() -> None:
    for _ in range(ROUNDS):
        run = start()
        a, b = race(
            lambda: services.attempt_claim(worker_id="a"),
            lambda: services.attempt_claim(worker_id="b"),
        )
        leases = [r for r in (a, b) if r is not None]
        assert len(leases) == 1, (a, b)
        assert not any(isinstance(r, Exception) for r in (a, b))
        assert Attempt.objects.filter(run=run, status="running").count() == 1
        run.refresh_from_db()
        assert run.lease_epoch == 1
        services.run_cancel(run_id=run.id)


def test_cancel_racing_a_step_commit_never_keeps_a_result_after_the_cancel() -> None:
    outcomes = set()
    for _ in range(ROUNDS):
        run = start()
        lease = claim()
        done, cancelled = race(
            lambda: services.attempt_complete(**epochs(lease), result={"done": True}),
            lambda: services.run_cancel(run_id=run.id, reason="race"),
        )
        run.refresh_from_db()
        if isinstance(cancelled, Exception):
            # The commit came first: the run finished, the cancel found nothing to cancel.
            assert isinstance(cancelled, HoldpointError) and cancelled.code == "invalid_state"
            assert run.status == "succeeded" and run.result == {"done": True}
            assert run.cancel_epoch == 0
            outcomes.add("completed")
        else:
            # The cancel was accepted: the commit must have been fenced.
            assert isinstance(done, HoldpointError) and done.code == "stale_after_cancel"
            assert run.status == "cancel_requested" and run.result is None
            assert not run.events.filter(type="run.succeeded").exists()
            outcomes.add("cancelled")
            services.attempt_release(
                attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="cancelled"
            )
    assert outcomes  # at least one ordering observed; both are legal


def test_two_resumes_of_one_request_have_one_winner(approver, operator) -> None:
    for _ in range(ROUNDS):
        run, _lease, cp, request = interrupted()
        a, b = race(
            lambda: services.run_resume(
                run_id=run.id,
                request_id=request.id,
                checkpoint_id=cp.id,
                value={"versions": ["a"]},
                user=approver,
            ),
            lambda: services.run_resume(
                run_id=run.id,
                request_id=request.id,
                checkpoint_id=cp.id,
                value={"versions": ["b"]},
                user=operator,
            ),
        )
        errors = [r for r in (a, b) if isinstance(r, Exception)]
        wins = [r for r in (a, b) if isinstance(r, Run)]
        assert len(wins) == 1 and len(errors) == 1, (a, b)
        assert isinstance(errors[0], HoldpointError)
        assert errors[0].code in {"request_mismatch", "invalid_state"}
        request.refresh_from_db()
        assert request.answer in ({"versions": ["a"]}, {"versions": ["b"]})
        assert Attempt.objects.filter(run=run, reason="resume").count() == 1
        services.run_cancel(run_id=run.id)


def test_retry_racing_cancel_leaves_one_consistent_outcome() -> None:
    for _ in range(ROUNDS):
        run = start()
        lease = claim()
        services.attempt_fail(**epochs(lease), error={"type": "ValueError", "message": "bad"})
        retried, cancelled = race(
            lambda: services.run_retry(run_id=run.id, reason="again"),
            lambda: services.run_cancel(run_id=run.id, reason="stop"),
        )
        assert not isinstance(retried, Exception), retried
        run.refresh_from_db()
        live = Attempt.objects.filter(run=run, status__in=["queued", "running"]).count()
        if isinstance(cancelled, Exception):
            # The cancel ran first and found a failed run; the retry then queued it.
            assert isinstance(cancelled, HoldpointError) and cancelled.code == "invalid_state"
            assert run.status == "queued" and live == 1
            services.run_cancel(run_id=run.id)
        else:
            # The retry ran first; the cancel then stopped the queued attempt.
            assert run.status == "cancelled" and live == 0
            assert run.attempts.order_by("-number").first().status == "aborted"
