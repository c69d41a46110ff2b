"""Each allowed transition of the run lifecycle, through the real services."""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine
from django.utils import timezone

from runs import services
from runs.errors import HoldpointError
from runs.models import Attempt, InputRequest, Run, RunEvent
from tests.runs.factory import claim, epochs, interrupted, snapshot, start

pytestmark = pytest.mark.django_db


def event_types(run_id: str) -> list[str]:
    return list(
        RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("type", flat=True)
    )


def test_it_starts_a_run_with_a_queued_first_attempt() -> None:
    run = start()
    assert run.id.startswith("run_")
    assert run.status == "queued"
    attempt = Attempt.objects.get(run=run)
    assert attempt.id.startswith("att_")
    assert (attempt.number, attempt.status, attempt.reason) == (1, "queued", "initial")
    assert event_types(run.id) == ["run.created"]


def test_it_refuses_an_unknown_agent_and_a_bad_input() -> None:
    with pytest.raises(HoldpointError) as exc:
        services.run_start(agent="nope", input={})
    assert exc.value.code == "unknown_agent"
    with pytest.raises(HoldpointError) as exc:
        services.run_start(agent="test-agent", input={"n": "one"})
    assert exc.value.code == "invalid_input"
    assert exc.value.extra["errors"][0]["pointer"] == "/n"
    assert Run.objects.count() == 0


def test_it_claims_with_both_epochs_and_a_lease() -> None:
    run = start()
    lease = claim("w1", lease_seconds=30)
    run.refresh_from_db()
    assert run.status == "running"
    assert lease.run_id == run.id
    assert lease.lease_epoch == run.lease_epoch == 1
    assert lease.cancel_epoch == run.cancel_epoch == 0
    attempt = Attempt.objects.get(pk=lease.attempt_id)
    assert attempt.worker_id == "w1"
    assert attempt.lease_epoch == 1 and attempt.cancel_epoch == 0
    assert attempt.lease_expires_at is not None
    assert 25 < (attempt.lease_expires_at - attempt.started_at).total_seconds() <= 30
    assert services.attempt_claim(worker_id="w2") is None


def test_it_claims_only_the_named_agents() -> None:
    start()
    assert services.attempt_claim(worker_id="w", agents=["other"]) is None
    assert services.attempt_claim(worker_id="w", agents=["test-agent"]) is not None


def test_it_heartbeats_and_reports_a_pending_cancel() -> None:
    start()
    lease = claim(lease_seconds=5)
    beat = services.attempt_heartbeat(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, lease_seconds=20
    )
    assert beat.lease_expires_at > lease.lease_expires_at
    assert beat.cancel_requested is False
    services.run_cancel(run_id=lease.run_id, reason="stop")
    beat = services.attempt_heartbeat(attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch)
    assert beat.cancel_requested is True


def test_it_saves_checkpoints_and_completes() -> None:
    run = start()
    lease = claim()
    cp1 = services.checkpoint_save(**epochs(lease), step="two", state={"a": 1})
    cp2 = services.checkpoint_save(**epochs(lease), step="three", state={"a": 2}, cost="0.25")
    assert cp1.id.startswith("cp_") and (cp1.number, cp2.number) == (1, 2)
    services.attempt_complete(**epochs(lease), result={"ok": True}, cost="0.5")
    run.refresh_from_db()
    assert run.status == "succeeded"
    assert run.result == {"ok": True}
    assert run.latest_checkpoint_id == cp2.id
    assert str(run.cost) == "0.500000"
    assert Attempt.objects.get(pk=lease.attempt_id).status == "succeeded"
    assert event_types(run.id) == [
        "run.created",
        "attempt.claimed",
        "checkpoint.saved",
        "checkpoint.saved",
        "run.succeeded",
    ]


def test_it_interrupts_with_a_compiled_compact_schema() -> None:
    run, _lease, cp, request = interrupted()
    assert run.status == "input_required"
    assert run.pending_request_id == request.id
    assert request.id.startswith("req_")
    assert request.checkpoint_id == cp.id
    assert request.accepted_schema == {
        "type": "object",
        "properties": {"versions": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
        "required": ["versions"],
        "additionalProperties": False,
    }
    attempt = Attempt.objects.get(pk=request.attempt_id)
    assert attempt.status == "interrupted" and attempt.lease_expires_at is None
    assert services.attempt_claim(worker_id="w2") is None


def test_it_interrupts_for_approval_with_the_decision_schema() -> None:
    run, _lease, _cp, request = interrupted(kind="auth_required", schema={})
    assert run.status == "auth_required"
    assert request.accepted_schema["properties"]["decision"]["enum"] == [
        "approve",
        "deny",
        "respond",
    ]
    assert request.action["target"] == "staging/auth/config"


def test_it_resumes_in_a_new_attempt_that_carries_the_answer(approver) -> None:
    run, _lease, cp, request = interrupted()
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=cp.id,
        value={"versions": ["v1", "v2"]},
        user=approver,
    )
    run.refresh_from_db()
    request.refresh_from_db()
    assert run.status == "queued" and run.pending_request_id is None
    assert request.status == "answered" and request.answered_by == approver
    lease = claim("w2")
    assert lease.number == 2 and lease.reason == "resume"
    assert lease.resume_from == {
        "checkpoint_id": cp.id,
        "step": "ask",
        "state": {"seen": 1},
        "number": 1,
    }
    assert lease.resume_request is not None
    assert lease.resume_request["answer"] == {"versions": ["v1", "v2"]}
    assert lease.resume_request["answered_by"] == "alice"
    assert lease.lease_epoch == 2


def test_it_cancels_at_once_without_a_live_lease() -> None:
    run = start()
    services.run_cancel(run_id=run.id, reason="not needed")
    run.refresh_from_db()
    assert run.status == "cancelled" and run.cancel_epoch == 1
    assert Attempt.objects.get(run=run).status == "aborted"
    assert services.attempt_claim(worker_id="w") is None


def test_it_cancels_a_run_waiting_for_input_and_closes_the_question() -> None:
    run, _lease, _cp, request = interrupted()
    services.run_cancel(run_id=run.id)
    run.refresh_from_db()
    request.refresh_from_db()
    assert run.status == "cancelled"
    assert request.status == "cancelled" and request.closed_reason == "Closed: run cancelled"


def test_it_cancels_a_run_that_is_backing_off() -> None:
    run = start()
    lease = claim()
    services.attempt_fail(**epochs(lease), error={"type": "Timeout", "message": "slow"})
    run.refresh_from_db()
    assert run.status == "waiting"
    services.run_cancel(run_id=run.id)
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert run.attempts.order_by("-number").first().status == "aborted"


def test_it_asks_a_live_worker_to_stop_and_fences_it() -> None:
    run = start()
    lease = claim()
    services.run_cancel(run_id=run.id, reason="wrong target")
    run.refresh_from_db()
    assert run.status == "cancel_requested" and run.cancel_epoch == 1
    before = snapshot(run.id)
    with pytest.raises(HoldpointError) as exc:
        services.attempt_complete(**epochs(lease), result={"late": True})
    assert exc.value.code == "stale_after_cancel"
    assert snapshot(run.id) == before
    # The worker acknowledges: the cancel becomes final.
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="cancelled"
    )
    run.refresh_from_db()
    assert run.status == "cancelled" and run.result is None
    assert Attempt.objects.get(pk=lease.attempt_id).status == "aborted"


def test_a_second_cancel_is_accepted_and_changes_nothing() -> None:
    run = start()
    claim()
    services.run_cancel(run_id=run.id)
    before = snapshot(run.id)
    services.run_cancel(run_id=run.id)
    assert snapshot(run.id) == before


def test_it_releases_for_shutdown_into_a_new_attempt_from_the_latest_checkpoint() -> None:
    run = start()
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="b", state={})
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="shutdown"
    )
    run.refresh_from_db()
    assert run.status == "queued"
    nxt = claim("w2")
    assert nxt.number == 2 and nxt.resume_from["checkpoint_id"] == cp.id
    # Recorded as a hand-over by a stopping worker, not a lease that ran out.
    assert nxt.reason == "released"


def test_it_retries_a_failed_run_from_an_earlier_checkpoint_keeping_history() -> None:
    run = start()
    lease = claim()
    cp1 = services.checkpoint_save(**epochs(lease), step="b", state={"i": 1})
    services.checkpoint_save(**epochs(lease), step="c", state={"i": 2})
    services.attempt_fail(**epochs(lease), error={"type": "ValueError", "message": "bad input"})
    run.refresh_from_db()
    assert (run.status, run.failure_class) == ("failed", "deterministic")
    services.run_retry(run_id=run.id, reason="fixed the input", from_checkpoint_id=cp1.id)
    run.refresh_from_db()
    assert run.status == "queued" and run.failure_class == ""
    old = Attempt.objects.get(pk=lease.attempt_id)
    assert (old.status, old.error_type, old.error_message) == ("failed", "ValueError", "bad input")
    nxt = claim("w2")
    assert nxt.reason == "retry" and nxt.resume_from["checkpoint_id"] == cp1.id


def test_it_backs_off_then_stops_on_the_same_error_in_a_row() -> None:
    run = start()
    for number in (1, 2):
        lease = claim()
        services.attempt_fail(
            **epochs(lease), error={"type": "Timeout", "message": f"took {number}0 ms", "step": "s"}
        )
        run.refresh_from_db()
        assert run.status == "waiting"
        assert run.attempts.order_by("-number").first().reason == "auto_retry"
    lease = claim()
    services.attempt_fail(
        **epochs(lease), error={"type": "Timeout", "message": "took 99 ms", "step": "s"}
    )
    run.refresh_from_db()
    assert (run.status, run.failure_class) == ("failed", "repeated_error")
    prints = set(run.attempts.values_list("error_fingerprint", flat=True))
    assert len(prints) == 1


def test_it_stops_when_the_retry_budget_is_spent() -> None:
    run = start()
    for number in range(4):
        lease = claim()
        services.attempt_fail(**epochs(lease), error={"type": f"E{number}", "message": "x"})
    run.refresh_from_db()
    assert (run.status, run.failure_class) == ("failed", "transient")
    assert "budget" in run.failure_detail
    assert run.attempts.count() == 4


def test_backoff_grows_exponentially_within_the_jitter() -> None:
    from runs.agents import RetryPolicy

    policy = RetryPolicy(backoff_initial=2, backoff_multiplier=2, backoff_max=30, jitter=0.5)
    for failures, base in [(1, 2), (2, 4), (3, 8), (6, 30)]:
        delays = [policy.backoff_seconds(failures) for _ in range(200)]
        assert all(base * 0.5 <= d <= base for d in delays)
        assert max(delays) - min(delays) > 0  # jitter spreads them


def test_it_expires_an_unanswered_request_and_a_retry_asks_again() -> None:
    run, _lease, cp, request = interrupted(expires_in=60)
    with time_machine.travel(timezone.now() + dt.timedelta(seconds=61)):
        assert services.requests_expire() == 1
    run.refresh_from_db()
    request.refresh_from_db()
    assert (run.status, run.failure_class) == ("failed", "input_expired")
    assert request.status == "expired"
    services.run_retry(run_id=run.id, reason="ask again")
    lease = claim("w2")
    # The new attempt restarts the step that asked, so it asks a new question.
    assert lease.resume_from["checkpoint_id"] == cp.id
    assert lease.resume_request is None


def test_it_expires_a_lost_lease_into_a_new_attempt_then_stops_at_the_cap() -> None:
    run = start()
    for _ in range(2):
        lease = claim(lease_seconds=0.1)
        Attempt.objects.filter(pk=lease.attempt_id).update(
            lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
        )
        assert services.leases_expire() == 1
    run.refresh_from_db()
    assert (run.status, run.failure_class) == ("failed", "lease_lost")
    assert list(run.attempts.values_list("status", "reason")) == [
        ("lost", "initial"),
        ("lost", "lease_expired"),
    ]


def test_a_due_backoff_is_queued_by_the_sweep() -> None:
    run = start()
    lease = claim()
    services.attempt_fail(**epochs(lease), error={"type": "Timeout", "message": "x"})
    assert services.backoffs_due() == 1
    run.refresh_from_db()
    assert run.status == "queued"


def test_events_are_gap_free_and_unique_per_run() -> None:
    run, _lease, cp, request = interrupted()
    services.run_resume(
        run_id=run.id, request_id=request.id, checkpoint_id=cp.id, value={"versions": ["v2"]}
    )
    seqs = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    run.refresh_from_db()
    assert run.last_event_seq == len(seqs)


def test_inbox_request_is_unchanged_once_created() -> None:
    _run, _lease, _cp, request = interrupted()
    assert InputRequest.objects.get(pk=request.id).prompt == "请选择需要保持兼容的 Token 版本"
