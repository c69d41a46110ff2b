"""A renewal in one statement (``renew_lease``) and the locked fence (``lock_for_worker_write``)
give the same verdict on every write they judge; a refused renewal changes nothing.

On PostgreSQL the heartbeat is the one ``UPDATE … RETURNING``; on SQLite (the newcomer
mode) ``renew_lease`` declines and the locked path renews, with the same answers.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import services
from runs.db import postgresql
from runs.errors import HoldpointError
from runs.models import AgentGate, Attempt
from runs.services._base import lock_for_worker_write, renew_lease
from runs.tokens import worker_token_create
from tests.runs.factory import AGENT, claim, snapshot, start

pytestmark = pytest.mark.django_db


def _code(call: Callable[[], Any]) -> str | None:
    try:
        call()
    except HoldpointError as exc:
        return exc.code
    return None


def _both(attempt_id: str, lease_epoch: int, token: int | None) -> tuple[bool, str | None]:
    """(the one statement renewed, the code the locked fence answers)."""
    renewed = renew_lease(
        attempt_id=attempt_id, lease_epoch=lease_epoch, seconds=30, worker_token_id=token
    )
    code = _code(
        lambda: lock_for_worker_write(
            attempt_id=attempt_id,
            lease_epoch=lease_epoch,
            cancel_epoch=None,
            worker_token_id=token,
        )
    )
    return renewed is not None, code


def test_it_renews_in_one_statement_and_answers_as_the_locked_path() -> None:
    run = start()
    lease = claim(lease_seconds=5)
    with CaptureQueriesContext(connection) as queries:
        beat = services.attempt_heartbeat(
            attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, lease_seconds=60
        )
    attempt = Attempt.objects.get(pk=lease.attempt_id)
    assert attempt.lease_expires_at == beat.lease_expires_at
    assert beat.lease_expires_at > lease.lease_expires_at + dt.timedelta(seconds=50)
    assert (beat.cancel_requested, beat.pause_requested) == (False, False)
    if postgresql():
        assert len(queries) == 1, [q["sql"] for q in queries]
    # The agent's gate closes: the renewal says pause, as the locked path says.
    AgentGate.objects.update_or_create(
        agent=AGENT, defaults={"paused": True, "paused_at": timezone.now()}
    )
    beat = services.attempt_heartbeat(attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch)
    assert beat.pause_requested is True
    # Cancelled: still renewed (heartbeats are not fenced by the cancel), and told so.
    services.run_cancel(run_id=run.id, actor=None)
    beat = services.attempt_heartbeat(attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch)
    assert beat.cancel_requested is True


@pytest.mark.parametrize("case", ["stale_epoch", "other_token", "ran_out", "released", "missing"])
def test_it_refuses_what_the_locked_fence_refuses_and_changes_nothing(case: str) -> None:
    run = start()
    token, _ = worker_token_create(name="holder")
    other, _ = worker_token_create(name="other")
    lease = services.attempt_claim(worker_id="w1", worker_token_id=token.pk)
    assert lease is not None
    attempt_id, epoch, token_id = lease.attempt_id, lease.lease_epoch, token.pk
    expected = "stale_worker"
    if case == "stale_epoch":
        epoch -= 1
    elif case == "other_token":
        token_id, expected = other.pk, "not_your_lease"
    elif case == "ran_out":
        Attempt.objects.filter(pk=attempt_id).update(
            lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
        )
    elif case == "released":
        services.attempt_release(
            attempt_id=attempt_id, lease_epoch=epoch, reason="shutdown", worker_token_id=token.pk
        )
    else:
        attempt_id, expected = "att_00000000000000000000000000", "not_found"
    before = snapshot(run.id)
    assert _both(attempt_id, epoch, token_id) == (False, expected)
    code = _code(
        lambda: services.attempt_heartbeat(
            attempt_id=attempt_id, lease_epoch=epoch, worker_token_id=token_id
        )
    )
    assert code == expected
    assert snapshot(run.id) == before


def test_the_in_process_worker_renews_without_a_token() -> None:
    start()
    lease = claim()
    renewed, code = _both(lease.attempt_id, lease.lease_epoch, None)
    assert code is None
    assert renewed is postgresql()


def test_a_batch_fences_each_attempt_on_its_own() -> None:
    first, second = start(), start()
    token, _ = worker_token_create(name="batch")
    a = services.attempt_claim(worker_id="w/1", worker_token_id=token.pk)
    b = services.attempt_claim(worker_id="w/2", worker_token_id=token.pk)
    assert a is not None and b is not None
    before_b = snapshot(b.run_id)
    answers = services.attempts_heartbeat(
        beats=[(a.attempt_id, a.lease_epoch, None), (b.attempt_id, b.lease_epoch + 1, None)],
        lease_seconds=60,
        worker_token_id=token.pk,
    )
    assert isinstance(answers[0], services.Heartbeat)
    assert isinstance(answers[1], HoldpointError) and answers[1].code == "stale_worker"
    assert snapshot(b.run_id) == before_b
    renewed = Attempt.objects.get(pk=a.attempt_id).lease_expires_at
    assert renewed == answers[0].lease_expires_at > a.lease_expires_at
    assert {first.id, second.id} == {a.run_id, b.run_id}


def test_a_batch_longer_than_the_limit_is_refused_whole() -> None:
    start()
    lease = claim()
    before = Attempt.objects.get(pk=lease.attempt_id).lease_expires_at
    beats = [(lease.attempt_id, lease.lease_epoch, None)] * (services.MAX_HEARTBEAT_BATCH + 1)
    with pytest.raises(HoldpointError) as refused:
        services.attempts_heartbeat(beats=beats)
    assert refused.value.code == "invalid_input"
    assert Attempt.objects.get(pk=lease.attempt_id).lease_expires_at == before
