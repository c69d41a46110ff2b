"""Each refused transition gives its exact code and leaves run, attempts, requests and
events exactly as they were."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from runs import services
from runs.errors import HoldpointError
from runs.models import Attempt
from tests.runs.factory import claim, epochs, interrupted, snapshot, start

pytestmark = pytest.mark.django_db


def refused(run_id: str, code: str, call: Callable[[], Any]) -> HoldpointError:
    before = snapshot(run_id)
    with pytest.raises(HoldpointError) as exc:
        call()
    assert exc.value.code == code, exc.value.detail
    assert snapshot(run_id) == before
    return exc.value


def finished_run() -> tuple[Any, Any]:
    run = start()
    lease = claim()
    services.attempt_complete(**epochs(lease), result={})
    return run, lease


def test_it_refuses_worker_writes_after_cancel_with_stale_after_cancel() -> None:
    run = start()
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="s", state={})
    services.run_cancel(run_id=run.id)
    for call in (
        lambda: services.checkpoint_save(**epochs(lease), step="t", state={}),
        lambda: services.attempt_complete(**epochs(lease), result={}),
        lambda: services.attempt_fail(**epochs(lease), error={"type": "E", "message": ""}),
        lambda: services.attempt_interrupt(
            **epochs(lease),
            checkpoint_id=cp.id,
            kind="input_required",
            prompt="?",
            accepted_schema={"a": "string"},
        ),
    ):
        refused(run.id, "stale_after_cancel", call)


def test_the_seed_sequence_rejects_the_crashed_workers_commit_as_stale_worker() -> None:
    run = start()
    # Two earlier grants so the crashing worker holds lease_epoch 3, as in the seed.
    for _ in range(2):
        lease = claim()
        services.attempt_release(
            attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="shutdown"
        )
    old = claim("crashing-worker", lease_seconds=5)
    assert old.lease_epoch == 3
    Attempt.objects.filter(pk=old.attempt_id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert services.leases_expire() == 1
    new = claim("w2")
    assert new.lease_epoch == 4 and new.reason == "lease_expired"
    refused(
        run.id,
        "stale_worker",
        lambda: services.attempt_complete(**epochs(old), result={"from": "old"}),
    )
    services.attempt_complete(**epochs(new), result={"from": "new"})
    run.refresh_from_db()
    assert run.result == {"from": "new"}


def test_it_refuses_a_write_whose_lease_ran_out_even_before_the_sweep() -> None:
    run = start()
    lease = claim(lease_seconds=5)
    Attempt.objects.filter(pk=lease.attempt_id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    refused(
        run.id,
        "stale_worker",
        lambda: services.checkpoint_save(**epochs(lease), step="s", state={}),
    )
    refused(
        run.id,
        "stale_worker",
        lambda: services.attempt_heartbeat(
            attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch
        ),
    )


def test_heartbeat_and_release_are_fenced_by_lease_epoch() -> None:
    run = start()
    lease = claim()
    refused(
        run.id,
        "stale_worker",
        lambda: services.attempt_heartbeat(
            attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch + 1
        ),
    )
    refused(
        run.id,
        "stale_worker",
        lambda: services.attempt_release(
            attempt_id=lease.attempt_id, lease_epoch=99, reason="shutdown"
        ),
    )
    refused(
        run.id,
        "invalid_state",
        lambda: services.attempt_release(
            attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="cancelled"
        ),
    )
    refused(
        run.id,
        "invalid_input",
        lambda: services.attempt_release(
            attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="bored"
        ),
    )


def test_it_refuses_writes_on_an_interrupted_attempt() -> None:
    run, lease, _cp, _req = interrupted()
    refused(run.id, "stale_worker", lambda: services.attempt_complete(**epochs(lease), result={}))


def test_interrupt_must_be_on_the_latest_checkpoint() -> None:
    run = start()
    lease = claim()
    cp1 = services.checkpoint_save(**epochs(lease), step="a", state={})
    services.checkpoint_save(**epochs(lease), step="b", state={})
    refused(
        run.id,
        "stale_checkpoint",
        lambda: services.attempt_interrupt(
            **epochs(lease),
            checkpoint_id=cp1.id,
            kind="input_required",
            prompt="?",
            accepted_schema={"a": "string"},
        ),
    )


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"kind": "question"}, "bad kind"),
        ({"prompt": ""}, "empty prompt"),
        ({"accepted_schema": {"a": "strin"}}, "bad compact type"),
        ({"accepted_schema": {"type": "nope"}}, "bad JSON schema"),
        ({"accepted_schema": "string"}, "schema not an object"),
        ({"expires_in": 0}, "expiry not in the future"),
        ({"expires_at": "2001-01-01T00:00:00Z"}, "expiry in the past"),
        ({"context": ["x"]}, "context not an object"),
        ({"kind": "auth_required", "action": None}, "approval without action"),
    ],
)
def test_interrupt_refuses_bad_requests(kwargs: dict[str, Any], why: str) -> None:
    run = start()
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="a", state={})
    args = {
        "checkpoint_id": cp.id,
        "kind": "input_required",
        "prompt": "?",
        "accepted_schema": {"a": "string"},
        **kwargs,
    }
    refused(run.id, "invalid_input", lambda: services.attempt_interrupt(**epochs(lease), **args))


def test_resume_checks_status_request_checkpoint_expiry_and_schema(approver) -> None:
    run, _lease, cp, request = interrupted(expires_in=60)
    ok = {
        "run_id": run.id,
        "request_id": request.id,
        "checkpoint_id": cp.id,
        "value": {"versions": ["v1"]},
    }
    refused(
        run.id, "request_mismatch", lambda: services.run_resume(**{**ok, "request_id": "req_nope"})
    )
    refused(
        run.id,
        "stale_checkpoint",
        lambda: services.run_resume(**{**ok, "checkpoint_id": "cp_nope"}),
    )
    err = refused(
        run.id, "invalid_input", lambda: services.run_resume(**{**ok, "value": {"versions": "v1"}})
    )
    assert err.extra["errors"][0]["pointer"] == "/versions"
    refused(
        run.id,
        "invalid_input",
        lambda: services.run_resume(**{**ok, "value": {"versions": [], "x": 1}}),
    )
    with time_machine.travel(timezone.now() + dt.timedelta(seconds=61)):
        refused(run.id, "request_expired", lambda: services.run_resume(**ok))
    services.run_resume(**ok, user=approver)
    err = refused(run.id, "request_mismatch", lambda: services.run_resume(**ok))
    assert err.extra["answered_by"] == "alice"
    assert "Already answered by alice" in err.detail


def test_resume_refuses_an_expired_or_cancelled_request() -> None:
    run, _lease, cp, request = interrupted(expires_in=60)
    with time_machine.travel(timezone.now() + dt.timedelta(seconds=61)):
        services.requests_expire()
    ok = {
        "run_id": run.id,
        "request_id": request.id,
        "checkpoint_id": cp.id,
        "value": {"versions": []},
    }
    refused(run.id, "request_expired", lambda: services.run_resume(**ok))
    run2, _l, cp2, req2 = interrupted()
    services.run_cancel(run_id=run2.id)
    refused(
        run2.id,
        "invalid_state",
        lambda: services.run_resume(
            run_id=run2.id, request_id=req2.id, checkpoint_id=cp2.id, value={"versions": []}
        ),
    )


def test_resume_refuses_a_request_of_another_run() -> None:
    run, _lease, cp, _request = interrupted()
    _other, _l2, _cp2, other_request = interrupted()
    refused(
        run.id,
        "request_mismatch",
        lambda: services.run_resume(
            run_id=run.id, request_id=other_request.id, checkpoint_id=cp.id, value={"versions": []}
        ),
    )


def test_resume_refuses_a_run_that_is_not_waiting() -> None:
    run = start()
    refused(
        run.id,
        "request_mismatch",
        lambda: services.run_resume(
            run_id=run.id, request_id="req_x", checkpoint_id="cp_x", value={}
        ),
    )


def test_cancel_refuses_finished_runs() -> None:
    run, _lease = finished_run()
    refused(run.id, "invalid_state", lambda: services.run_cancel(run_id=run.id))
    with pytest.raises(HoldpointError) as exc:
        services.run_cancel(run_id="run_missing")
    assert exc.value.code == "not_found"


def test_retry_refuses_live_and_succeeded_runs_and_needs_a_reason() -> None:
    done, _lease = finished_run()
    refused(done.id, "invalid_state", lambda: services.run_retry(run_id=done.id, reason="again"))
    run = start()
    refused(run.id, "invalid_state", lambda: services.run_retry(run_id=run.id, reason="again"))
    services.run_cancel(run_id=run.id)
    refused(run.id, "invalid_input", lambda: services.run_retry(run_id=run.id, reason="  "))
    refused(
        run.id,
        "invalid_input",
        lambda: services.run_retry(run_id=run.id, reason="x", from_checkpoint_id="cp_other"),
    )


def test_retry_refuses_when_a_guard_says_no() -> None:
    from runs.services import control

    run = start()
    services.run_cancel(run_id=run.id)
    guard = lambda r: "Side effects are unsettled." if r.id == run.id else None  # noqa: E731
    services.register_retry_guard(guard)
    try:
        err = refused(
            run.id, "retry_not_allowed", lambda: services.run_retry(run_id=run.id, reason="again")
        )
        assert err.extra["reasons"] == ["Side effects are unsettled."]
    finally:
        control._retry_guards.remove(guard)


def test_claim_and_worker_writes_refuse_bad_arguments() -> None:
    run = start()
    with pytest.raises(HoldpointError) as exc:
        services.attempt_claim(worker_id="")
    assert exc.value.code == "invalid_input"
    with pytest.raises(HoldpointError) as exc:
        services.attempt_claim(worker_id="w", lease_seconds=0)
    assert exc.value.code == "invalid_input"
    lease = claim()
    refused(
        run.id,
        "invalid_input",
        lambda: services.checkpoint_save(**epochs(lease), step="", state={}),
    )
    refused(
        run.id,
        "invalid_input",
        lambda: services.attempt_fail(**epochs(lease), error={"message": "no type"}),
    )
    refused(
        run.id,
        "invalid_input",
        lambda: services.attempt_fail(**epochs(lease), error={"type": "E", "class": "weird"}),
    )
    refused(
        run.id,
        "invalid_input",
        lambda: services.attempt_complete(**epochs(lease), result={}, cost="-1"),
    )
    with pytest.raises(HoldpointError) as exc:
        services.attempt_heartbeat(attempt_id="att_missing", lease_epoch=1)
    assert exc.value.code == "not_found"
