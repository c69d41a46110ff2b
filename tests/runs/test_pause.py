"""Pause, through the real services: each state's answer, continuing, the agent gate."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from runs import services
from runs.errors import HoldpointError
from runs.models import AgentGate, Attempt, InputRequest, Run, RunEvent
from tests.runs.factory import AGENT, claim, epochs, interrupted, snapshot, start

pytestmark = pytest.mark.django_db


def event_types(run_id: str) -> list[str]:
    return list(
        RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("type", flat=True)
    )


def refused(code: str, call: Any) -> HoldpointError:
    with pytest.raises(HoldpointError) as caught:
        call()
    assert caught.value.code == code, caught.value
    return caught.value


def running_with_checkpoint() -> tuple[Run, Any, Any]:
    run = start()
    lease = claim(lease_seconds=30)
    cp = services.checkpoint_save(**epochs(lease), step="two", state={"n": 1})
    run.refresh_from_db()
    return run, lease, cp


def expire(run_id: str) -> None:
    Attempt.objects.filter(run_id=run_id, status="running").update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )


def pause_request(run: Run) -> InputRequest:
    run.refresh_from_db()
    assert run.status == "paused", run.status
    request = InputRequest.objects.get(pk=run.pending_request_id)
    assert request.kind == "pause" and request.status == "pending"
    return request


# --- Each state's answer to pause --------------------------------------------------------


def test_it_pauses_a_queued_run_at_once_and_nothing_claims_it() -> None:
    run = start()
    services.run_pause(run_id=run.id, reason="look first", actor="user:olivia")
    request = pause_request(run)
    assert request.prompt == "look first" and request.checkpoint_id is None
    assert request.context["paused_by"] == "user:olivia"
    assert request.accepted_schema == {"type": "null"}
    # A pause has no expiry unless given.
    assert request.expires_at > timezone.now() + dt.timedelta(days=3650)
    assert run.attempts.get().status == "aborted"
    assert event_types(run.id)[-2:] == ["run.pause_requested", "run.paused"]
    assert services.attempt_claim(worker_id="w") is None


def test_it_pauses_a_backing_off_run_at_once() -> None:
    run = start()
    lease = claim()
    services.checkpoint_save(**epochs(lease), step="two", state={})
    services.attempt_fail(**epochs(lease), error={"type": "Timeout", "message": "slow"})
    run.refresh_from_db()
    assert run.status == "waiting"
    services.run_pause(run_id=run.id, reason="rate-limit alarm")
    request = pause_request(run)
    assert request.checkpoint_id == run.latest_checkpoint_id
    assert run.attempts.order_by("-number").first().status == "aborted"
    assert services.attempt_claim(worker_id="w") is None


def test_a_running_run_is_asked_and_pauses_at_the_boundary_with_its_checkpoint() -> None:
    run, lease, cp = running_with_checkpoint()
    services.run_pause(run_id=run.id, reason="operator wants a look", actor="user:olivia")
    run.refresh_from_db()
    assert run.status == "pause_requested"
    beat = services.attempt_heartbeat(attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch)
    assert beat.pause_requested and not beat.cancel_requested
    # A pause is not a fence: the step's commit stands, and its answer says stop here.
    cp2 = services.checkpoint_save(**epochs(lease), step="three", state={"n": 2})
    assert cp2.pause_requested
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="paused"
    )
    request = pause_request(run)
    assert request.checkpoint_id == cp2.id and run.latest_checkpoint_id == cp2.id
    assert request.prompt == "operator wants a look"
    assert request.context["paused_by"] == "user:olivia"
    assert request.context["step"] == "three"
    assert Attempt.objects.get(pk=lease.attempt_id).status == "interrupted"
    assert run.pause_reason == "" and run.pause_requested_at is None
    assert cp.id != cp2.id


def test_a_running_run_whose_lease_ran_out_is_paused_at_once() -> None:
    run, lease, cp = running_with_checkpoint()
    expire(run.id)
    services.run_pause(run_id=run.id, reason="stop")
    request = pause_request(run)
    assert request.checkpoint_id == cp.id
    assert Attempt.objects.get(pk=lease.attempt_id).status == "lost"
    # The old worker's writes are refused: its lease is gone.
    refused("stale_worker", lambda: services.checkpoint_save(**epochs(lease), step="x", state={}))


@pytest.mark.parametrize("kind", ["input_required", "auth_required"])
def test_a_run_waiting_for_a_person_is_refused(kind: str) -> None:
    run, _lease, _cp, _request = interrupted(kind=kind)
    before = snapshot(run.id)
    error = refused("invalid_state", lambda: services.run_pause(run_id=run.id, reason="x"))
    assert "already waiting for a person" in error.detail
    assert snapshot(run.id) == before


def test_a_cancelling_and_a_finished_run_are_refused() -> None:
    run, _lease, _cp = running_with_checkpoint()
    services.run_cancel(run_id=run.id)
    run.refresh_from_db()
    assert run.status == "cancel_requested"
    before = snapshot(run.id)
    error = refused("invalid_state", lambda: services.run_pause(run_id=run.id, reason="x"))
    assert "cancel always wins" in error.detail
    assert snapshot(run.id) == before
    done = start()
    lease = claim()
    services.attempt_complete(**epochs(lease), result=1)
    for finished in (done.id, start().id):
        if finished != done.id:
            services.run_cancel(run_id=finished)
        before = snapshot(finished)
        refused("invalid_state", lambda: services.run_pause(run_id=finished, reason="x"))
        assert snapshot(finished) == before


def test_a_second_pause_answers_clearly_and_changes_nothing() -> None:
    run = start()
    services.run_pause(run_id=run.id, reason="first", actor="user:olivia")
    before = snapshot(run.id)
    error = refused("invalid_state", lambda: services.run_pause(run_id=run.id, reason="again"))
    assert error.extra["already_paused"] is True
    assert error.extra["paused_by"] == "user:olivia" and error.extra["pause_reason"] == "first"
    assert snapshot(run.id) == before
    running, _lease, _cp = running_with_checkpoint()
    services.run_pause(run_id=running.id, reason="first")
    before = snapshot(running.id)
    refused("invalid_state", lambda: services.run_pause(run_id=running.id, reason="again"))
    assert snapshot(running.id) == before


@pytest.mark.parametrize("reason", ["", "   ", "x" * 2001, None, 5])
def test_a_pause_needs_a_reason(reason: Any) -> None:
    run = start()
    before = snapshot(run.id)
    refused("invalid_input", lambda: services.run_pause(run_id=run.id, reason=reason))
    assert snapshot(run.id) == before


# --- Continuing -------------------------------------------------------------------------


def test_continuing_is_a_resume_of_the_pause_request_from_its_checkpoint() -> None:
    run, lease, _cp = running_with_checkpoint()
    services.run_pause(run_id=run.id, reason="look")
    cp2 = services.checkpoint_save(**epochs(lease), step="three", state={"n": 2})
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="paused"
    )
    request = pause_request(run)
    refused(
        "invalid_input",
        lambda: services.run_resume(
            run_id=run.id, request_id=request.id, checkpoint_id=cp2.id, value={"go": True}
        ),
    )
    services.run_resume(run_id=run.id, request_id=request.id, checkpoint_id=cp2.id, value=None)
    run.refresh_from_db()
    assert run.status == "queued" and run.pending_request_id is None
    assert event_types(run.id)[-1] == "run.continued"
    next_lease = claim()
    assert next_lease.reason == "resume"
    assert next_lease.resume_from is not None
    assert next_lease.resume_from["checkpoint_id"] == cp2.id
    assert next_lease.resume_from["step"] == "three"


def test_a_run_paused_before_its_first_checkpoint_continues_with_a_null_checkpoint() -> None:
    run = start()
    services.run_pause(run_id=run.id, reason="hold on")
    request = pause_request(run)
    services.run_resume(run_id=run.id, request_id=request.id, checkpoint_id=None, value=None)
    lease = claim()
    assert lease.resume_from is None and lease.reason == "resume"


def test_a_stale_continue_is_refused_after_a_continue_and_a_second_pause() -> None:
    run, lease, cp = running_with_checkpoint()
    services.run_pause(run_id=run.id, reason="one")
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="paused"
    )
    first = pause_request(run)
    services.run_resume(run_id=run.id, request_id=first.id, checkpoint_id=cp.id)
    lease2 = claim()
    cp2 = services.checkpoint_save(**epochs(lease2), step="three", state={})
    services.run_pause(run_id=run.id, reason="two")
    services.attempt_release(
        attempt_id=lease2.attempt_id, lease_epoch=lease2.lease_epoch, reason="paused"
    )
    second = pause_request(run)
    before = snapshot(run.id)
    # The first tab: its request was answered.
    error = refused(
        "request_mismatch",
        lambda: services.run_resume(run_id=run.id, request_id=first.id, checkpoint_id=cp.id),
    )
    assert error.extra["answered_by"] is None and error.extra["request_status"] == "answered"
    # A tab that knows the new request but shows the old state: the checkpoint check.
    refused(
        "stale_checkpoint",
        lambda: services.run_resume(run_id=run.id, request_id=second.id, checkpoint_id=cp.id),
    )
    assert snapshot(run.id) == before
    services.run_resume(run_id=run.id, request_id=second.id, checkpoint_id=cp2.id)


# --- Cancel wins ------------------------------------------------------------------------


def test_a_cancel_of_a_paused_run_cancels_it_and_closes_the_pause() -> None:
    run = start()
    services.run_pause(run_id=run.id, reason="look")
    request = pause_request(run)
    services.run_cancel(run_id=run.id)
    run.refresh_from_db()
    request.refresh_from_db()
    assert run.status == "cancelled" and request.status == "cancelled"


def test_a_cancel_of_a_pause_requested_run_wins_at_the_release() -> None:
    run, lease, _cp = running_with_checkpoint()
    services.run_pause(run_id=run.id, reason="look")
    services.run_cancel(run_id=run.id)
    run.refresh_from_db()
    assert run.status == "cancel_requested" and run.pause_reason == ""
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="paused"
    )
    run.refresh_from_db()
    assert run.status == "cancelled"
    assert not InputRequest.objects.filter(run=run, kind="pause").exists()


# --- What else ends a pause_requested run -----------------------------------------------


def test_the_lease_running_out_pauses_a_pause_requested_run_and_does_not_requeue_it() -> None:
    run, lease, cp = running_with_checkpoint()
    services.run_pause(run_id=run.id, reason="look")
    expire(run.id)
    assert services.leases_expire() == 1
    request = pause_request(run)
    assert request.checkpoint_id == cp.id
    assert Attempt.objects.get(pk=lease.attempt_id).status == "lost"
    assert not Attempt.objects.filter(run=run, status__in=["queued", "running"]).exists()
    assert services.attempt_claim(worker_id="w") is None


def test_a_transient_failure_while_pausing_pauses_instead_of_backing_off() -> None:
    run, lease, cp = running_with_checkpoint()
    services.run_pause(run_id=run.id, reason="look")
    services.attempt_fail(**epochs(lease), error={"type": "Timeout", "message": "slow"})
    request = pause_request(run)
    assert request.checkpoint_id == cp.id
    assert Attempt.objects.get(pk=lease.attempt_id).status == "failed"


def test_the_last_step_completing_while_pausing_succeeds() -> None:
    run, lease, _cp = running_with_checkpoint()
    services.run_pause(run_id=run.id, reason="look")
    services.attempt_complete(**epochs(lease), result={"ok": True})
    run.refresh_from_db()
    assert run.status == "succeeded" and run.pause_reason == ""


def test_a_question_asked_while_pausing_is_the_hold_point() -> None:
    run, lease, cp = running_with_checkpoint()
    services.run_pause(run_id=run.id, reason="look")
    services.attempt_interrupt(
        **epochs(lease), checkpoint_id=cp.id, kind="input_required", prompt="?", accepted_schema={}
    )
    run.refresh_from_db()
    assert run.status == "input_required" and run.pause_reason == ""


def test_a_breakpoint_is_a_pause_interrupt_on_the_latest_checkpoint() -> None:
    run = services.run_start(agent=AGENT, input={"n": 1}, pause_before=["three", "three"])
    assert run.pause_before == ["three"]
    lease = claim()
    assert lease.pause_before == ["three"]
    cp = services.checkpoint_save(**epochs(lease), step="three", state={})
    services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="pause",
        prompt="breakpoint before three",
        context={"breakpoint": "three"},
    )
    request = pause_request(run)
    assert request.context["breakpoint"] == "three" and request.checkpoint_id == cp.id
    assert event_types(run.id)[-1] == "run.paused"


@pytest.mark.parametrize("bad", [["x" * 101], "three", [""], [1], ["s"] * 101])
def test_it_refuses_bad_breakpoints(bad: Any) -> None:
    count = Run.objects.count()
    refused("invalid_input", lambda: services.run_start(agent=AGENT, input={}, pause_before=bad))
    assert Run.objects.count() == count


# --- The agent gate ---------------------------------------------------------------------


def test_the_agent_gate_holds_claims_stops_running_attempts_and_reopens() -> None:
    running, lease, cp = running_with_checkpoint()
    queued = start()
    services.agent_pause(agent=AGENT, reason="model misbehaves", actor="user:ines")
    gate = AgentGate.objects.get(pk=AGENT)
    assert gate.paused and gate.reason == "model misbehaves" and gate.actor == "user:ines"
    assert "agent.paused" in event_types(running.id)
    assert services.attempt_claim(worker_id="w") is None
    beat = services.attempt_heartbeat(attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch)
    assert beat.pause_requested
    cp2 = services.checkpoint_save(**epochs(lease), step="three", state={})
    assert cp2.pause_requested
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="paused"
    )
    running.refresh_from_db()
    assert running.status == "queued" and running.pending_request_id is None
    assert running.current_attempt.reason == "held"
    assert event_types(running.id)[-1] == "run.held"
    assert services.attempt_claim(worker_id="w") is None
    # A second pause answers clearly.
    refused("invalid_state", lambda: services.agent_pause(agent=AGENT, reason="again"))
    services.agent_unpause(agent=AGENT, actor="user:ines")
    assert "agent.unpaused" in event_types(running.id)
    # Soonest first: the queued run waited longer than the held one.
    first, second = claim("a"), claim("b")
    assert [first.run_id, second.run_id] == [queued.id, running.id]
    assert second.resume_from is not None and second.resume_from["checkpoint_id"] == cp2.id
    assert cp.id != cp2.id
    refused("invalid_state", lambda: services.agent_unpause(agent=AGENT))


def test_the_gate_of_an_unknown_agent_is_not_found() -> None:
    refused("not_found", lambda: services.agent_pause(agent="nobody", reason="x"))
    refused("not_found", lambda: services.agent_unpause(agent="nobody"))
    assert not AgentGate.objects.exists()


def test_a_closed_gate_leaves_other_agents_claimable() -> None:
    from runs.agents import AgentSpec, register_agent_spec, unregister_agent_spec

    register_agent_spec(AgentSpec(name="other-agent"))
    try:
        gated = start()
        other = services.run_start(agent="other-agent", input={})
        services.agent_pause(agent=AGENT, reason="x")
        lease = services.attempt_claim(worker_id="w")
        assert lease is not None and lease.run_id == other.id
        assert services.attempt_claim(worker_id="w") is None
        gated.refresh_from_db()
        assert gated.status == "queued"
    finally:
        unregister_agent_spec("other-agent")


@pytest.mark.postgres
def test_the_claim_sql_skips_the_gated_agent() -> None:
    """The gate is in the claim's own statement, not a check after it."""
    start()
    services.agent_pause(agent=AGENT, reason="x")
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert services.attempt_claim(worker_id="w") is None
    claim_sql = next(q["sql"] for q in queries if "SKIP LOCKED" in q["sql"])
    assert "runs_agentgate" in claim_sql and "NOT" in claim_sql.upper()
