"""Rules that used to be written in several places, judged at their boundary by every caller.

A lease is live strictly before its expiry instant (``runs/leases.py``); a run is claimable
in the states the transition table lets claim (``runs/states.py`` ``CLAIMABLE``).
"""

from __future__ import annotations

import datetime as dt

import pytest

from ledger.models import SideEffect
from ledger.services import stale_pending_q
from ledger.services._common import attempt_is_live
from runs import services
from runs.clock import db_now
from runs.errors import HoldpointError
from runs.leases import lease_ran_out, lease_ran_out_q
from runs.models import Attempt, Run, claimable_q
from runs.states import CLAIMABLE, TRANSITIONS, RunStatus
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db

T = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def test_it_calls_a_lease_over_at_its_exact_expiry_instant() -> None:
    assert lease_ran_out(T, T)
    assert lease_ran_out(T - dt.timedelta(microseconds=1), T)
    assert not lease_ran_out(T + dt.timedelta(microseconds=1), T)
    assert lease_ran_out(None, T)


def _running_attempt_expiring_at(expires_at: dt.datetime) -> tuple[Run, Attempt]:
    run = start()
    lease = claim()
    Attempt.objects.filter(pk=lease.attempt_id).update(lease_expires_at=expires_at)
    run.refresh_from_db()
    return run, Attempt.objects.get(pk=lease.attempt_id)


def test_the_sweep_and_the_ledger_agree_with_the_fence_at_the_instant() -> None:
    run, attempt = _running_attempt_expiring_at(T)
    SideEffect.objects.create(
        run=run,
        attempt=attempt,
        step_id="s",
        tool="webhook",
        idempotency_key="k-boundary",
        target="t",
        request={},
        reversibility="irreversible",
    )
    # The sweep's query, the ledger's "no live worker will settle it" and its "is the
    # attempt live" all say: over, at exactly T.
    assert Attempt.objects.filter(lease_ran_out_q(T), pk=attempt.pk).exists()
    assert SideEffect.objects.filter(stale_pending_q(lease_now=T), run=run).exists()
    assert not attempt_is_live(run, attempt, lease_now=T)
    # One microsecond before T, all of them still call it live.
    before = T - dt.timedelta(microseconds=1)
    assert not Attempt.objects.filter(lease_ran_out_q(before), pk=attempt.pk).exists()
    assert attempt_is_live(run, attempt, lease_now=before)


def test_it_refuses_the_write_and_sweeps_the_attempt_once_the_lease_is_over() -> None:
    # Against the real clock: the database's "now" is past the expiry, so the fence refuses
    # and the sweep takes the attempt back, in the same run of the rule.
    run = start()
    lease = claim()
    Attempt.objects.filter(pk=lease.attempt_id).update(lease_expires_at=db_now())
    with pytest.raises(HoldpointError) as refused:
        services.checkpoint_save(**epochs(lease), step="next", state={})
    assert refused.value.code == "stale_worker"
    assert services.leases_expire() == 1
    assert Attempt.objects.get(pk=lease.attempt_id).status == "lost"
    run.refresh_from_db()
    assert run.status in {RunStatus.QUEUED, RunStatus.FAILED}


def test_claimable_states_are_read_off_the_transition_table() -> None:
    assert {s for (s, op) in TRANSITIONS if op == "claim"} == CLAIMABLE
    queued = start()
    assert Run.objects.filter(claimable_q(), pk=queued.pk).exists()
    assert Run.objects.filter(claimable_q(db_now()), pk=queued.pk).exists()
    lease = claim()
    assert lease.run_id == queued.id
    assert not Run.objects.filter(claimable_q(), pk=queued.pk).exists()


def test_a_question_closed_by_the_sweep_writes_the_same_event_as_any_other_close() -> None:
    import time_machine

    from runs.models import InputRequest, RunEvent
    from tests.runs.factory import interrupted

    run, _lease, _cp, request = interrupted(expires_in=60)
    # The run no longer holds this question (it moved on); the question is still pending.
    Run.objects.filter(pk=run.pk).update(pending_request=None, status=RunStatus.QUEUED)
    with time_machine.travel(request.expires_at + dt.timedelta(seconds=1)):
        services.requests_expire()
    request.refresh_from_db()
    assert request.status == "cancelled"
    closed = RunEvent.objects.filter(run=run, type="request.closed").get()
    assert closed.payload["request_id"] == request.id
    assert closed.payload["reason"] == "Closed: the run moved on"
    assert InputRequest.objects.filter(run=run, status="pending").count() == 0
