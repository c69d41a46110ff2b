"""Pause races on real PostgreSQL: threads behind a barrier, 50 rounds each, no sleeps.

- pause vs the step's commit: the commit stands, then the run pauses on it;
- pause vs cancel: cancel wins, never both;
- pause vs lease expiry (and a claimer): paused, never running twice;
- continue vs a second pause: one order or the other, and a stale continue is refused.
"""

from __future__ import annotations

from typing import Any

import pytest

from runs import services
from runs.errors import HoldpointError
from runs.models import Attempt, InputRequest, RunEvent
from tests.runs.factory import claim, epochs, start
from tests.runs.test_pause import expire, pause_request
from tests.runs.test_races import ROUNDS, race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def release_paused(lease: Any) -> None:
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="paused"
    )


def test_pause_racing_the_step_commit_keeps_the_commit_then_pauses_on_it() -> None:
    orders = set()
    for n in range(ROUNDS):
        run = start()
        lease = claim(lease_seconds=30)
        services.checkpoint_save(**epochs(lease), step="two", state={"n": n})
        saved, paused = race(
            lambda: services.checkpoint_save(
                **epochs(lease),
                step="three",
                state={"n": n},
            ),
            lambda: services.run_pause(run_id=run.id, reason="race"),
        )
        assert not isinstance(saved, Exception), saved  # a pause is not a fence
        assert not isinstance(paused, Exception), paused
        orders.add("pause first" if saved.pause_requested else "commit first")
        run.refresh_from_db()
        assert run.status == "pause_requested"
        assert run.latest_checkpoint_id == saved.id
        # The worker stops at this boundary (told now, or at the latest by the heartbeat).
        release_paused(lease)
        request = pause_request(run)
        assert request.checkpoint_id == saved.id
        assert request.context["step"] == "three"
    assert orders  # both orders happen on a loaded machine; either must hold


def test_pause_racing_cancel_never_ends_both_ways_cancel_wins() -> None:
    outcomes = set()
    for n in range(ROUNDS):
        run = start()
        lease = claim(lease_seconds=30) if n % 2 == 0 else None
        paused, cancelled = race(
            lambda: services.run_pause(run_id=run.id, reason="race"),
            lambda: services.run_cancel(run_id=run.id, reason="race"),
        )
        assert not isinstance(cancelled, Exception), cancelled  # a cancel is never refused
        if isinstance(paused, HoldpointError):
            assert paused.code == "invalid_state"
            outcomes.add("cancel first")
        else:
            assert not isinstance(paused, Exception), paused
            outcomes.add("pause first")
        if lease is not None:
            run.refresh_from_db()
            assert run.status == "cancel_requested"
            release_paused(lease)  # the worker heard of the pause; the cancel still wins
        run.refresh_from_db()
        assert run.status == "cancelled", run.status
        assert run.pending_request_id is None
        assert not InputRequest.objects.filter(run=run, kind="pause", status="pending").exists()
        types = list(RunEvent.objects.filter(run=run).values_list("type", flat=True))
        assert types.count("run.cancelled") == 1
        assert "run.paused" not in types or types.index("run.paused") < types.index("run.cancelled")
    assert outcomes


def test_pause_racing_lease_expiry_and_a_claim_pauses_and_never_runs_twice() -> None:
    for _ in range(ROUNDS):
        run = start()
        old = claim("old", lease_seconds=30)
        services.checkpoint_save(**epochs(old), step="two", state={})
        expire(run.id)
        paused, swept, new = race(
            lambda: services.run_pause(run_id=run.id, reason="race"),
            lambda: services.leases_expire(),
            lambda: services.attempt_claim(worker_id="new", lease_seconds=30),
        )
        for result in (paused, swept, new):
            assert not isinstance(result, Exception), result
        # Never two live attempts, whatever the order.
        assert Attempt.objects.filter(run=run, status__in=["queued", "running"]).count() <= 1
        run.refresh_from_db()
        if new is not None:
            # The claim took the requeued attempt before the pause: the pause waits for
            # its boundary, and the old worker can write nothing.
            assert run.status == "pause_requested"
            with pytest.raises(HoldpointError) as caught:
                services.checkpoint_save(**epochs(old), step="late", state={})
            assert caught.value.code == "stale_worker"
            release_paused(new)
        pause_request(run)
        assert services.attempt_claim(worker_id="another") is None


def test_continue_racing_a_second_pause_leaves_one_order_and_refuses_the_stale_continue() -> None:
    outcomes = set()
    for _ in range(ROUNDS):
        run = start()
        lease = claim(lease_seconds=30)
        cp = services.checkpoint_save(**epochs(lease), step="two", state={})
        services.run_pause(run_id=run.id, reason="first")
        release_paused(lease)
        first = pause_request(run)
        continued, paused_again = race(
            lambda: services.run_resume(
                run_id=run.id,
                request_id=first.id,
                checkpoint_id=cp.id,
            ),
            lambda: services.run_pause(run_id=run.id, reason="second"),
        )
        assert not isinstance(continued, Exception), continued
        run.refresh_from_db()
        if isinstance(paused_again, HoldpointError):
            # The second pause came while the run was still paused: refused, nothing changed.
            assert paused_again.code == "invalid_state"
            assert run.status == "queued"
            outcomes.add("pause refused")
        else:
            assert not isinstance(paused_again, Exception), paused_again
            second = pause_request(run)
            assert second.id != first.id and second.prompt == "second"
            outcomes.add("paused again")
        # The tab that still shows the first pause cannot continue the run again.
        with pytest.raises(HoldpointError) as caught:
            services.run_resume(run_id=run.id, request_id=first.id, checkpoint_id=cp.id)
        assert caught.value.code == "request_mismatch"
        events = list(RunEvent.objects.filter(run=run).values_list("type", flat=True))
        assert events.count("run.continued") == 1
        services.run_cancel(run_id=run.id)
    assert outcomes
