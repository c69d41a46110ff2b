"""Every control operation and decision says how it was made and with which credential
(issue 28, the audit): the services take ``via`` and ``identity`` and write them on the
events they append (``runs/audit.py``); system actions write neither."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.utils import timezone

from runs import services
from runs.approvals import parse_policy
from runs.audit import shell_identity
from runs.events import how
from runs.models import AgentApprovalPolicy, ApprovalVote, RunEvent
from tests.runs.factory import AGENT, claim, epochs, interrupted, start

pytestmark = pytest.mark.django_db

DOOR = {"via": "api", "identity": "token:0123456789ab"}


def payloads(run_id: str, type: str) -> list[dict[str, Any]]:
    return [e.payload for e in RunEvent.objects.filter(run_id=run_id, type=type).order_by("seq")]


def door_of(payload: dict[str, Any]) -> tuple[Any, Any]:
    return payload.get("via"), payload.get("identity")


def test_it_says_nothing_for_no_door_and_refuses_an_unknown_one() -> None:
    assert how() == {}
    assert how(via="cli", identity="shell:root") == {"via": "cli", "identity": "shell:root"}
    assert how(identity="x" * 500) == {"identity": "x" * 200}
    with pytest.raises(ValueError, match="unknown door"):
        how(via="fax")
    with pytest.raises(ValueError, match="unknown door"):
        services.run_cancel(run_id="run_none", via="telegram")
    assert shell_identity().startswith("shell")


def test_start_cancel_and_retry_record_their_door(operator: User) -> None:
    run = start(user=operator, **DOOR)
    [created] = payloads(run.id, "run.created")
    assert door_of(created) == ("api", "token:0123456789ab")
    services.run_cancel(run_id=run.id, user=operator, reason="wrong env", **DOOR)
    [asked] = payloads(run.id, "run.cancel_requested")
    [done] = payloads(run.id, "run.cancelled")
    assert door_of(asked) == door_of(done) == ("api", "token:0123456789ab")
    assert asked["reason"] == "wrong env"  # the payload's own members are unchanged
    services.run_retry(
        run_id=run.id, reason="again", user=operator, via="dashboard", identity="session"
    )
    [retried] = payloads(run.id, "run.retried")
    assert door_of(retried) == ("dashboard", "session") and retried["reason"] == "again"


def test_a_call_without_a_door_writes_neither_member(operator: User) -> None:
    run = start(user=operator)
    services.run_cancel(run_id=run.id, user=operator)
    for type in ("run.created", "run.cancel_requested", "run.cancelled"):
        [payload] = payloads(run.id, type)
        assert "via" not in payload and "identity" not in payload, type


def test_an_answer_and_its_resume_record_the_door(operator: User) -> None:
    run, _lease, cp, req = interrupted()
    services.run_resume(
        run_id=run.id,
        request_id=req.id,
        checkpoint_id=cp.id,
        value={"versions": ["v2"]},
        user=operator,
        via="cli",
        identity="shell:ops",
    )
    [answered] = payloads(run.id, "request.answered")
    [resumed] = payloads(run.id, "run.resumed")
    assert door_of(answered) == door_of(resumed) == ("cli", "shell:ops")


def test_each_approval_event_and_the_vote_record_the_door(approver: User) -> None:
    bob = User.objects.create_user("bob")
    bob.groups.add(*approver.groups.all())
    AgentApprovalPolicy.objects.create(
        agent=AGENT, policy=parse_policy({"required": 2, "any_deny_closes": False})
    )
    run, _lease, cp, req = interrupted(kind="auth_required")

    def decide(user: User, decision: str, via: str, identity: str) -> None:
        services.run_resume(
            run_id=run.id,
            request_id=req.id,
            checkpoint_id=cp.id,
            value={"decision": decision, "comment": f"{decision} by {user}"},
            user=user,
            via=via,
            identity=identity,
        )

    decide(approver, "approve", "email", "email-link")
    decide(bob, "deny", "api", "session")  # an objection: the policy lets it stand alone
    decide(bob, "approve", "dashboard", "session")  # bob changes his mind: 2 approvals
    assert [door_of(p) for p in payloads(run.id, "approval.given")] == [("email", "email-link")]
    assert [door_of(p) for p in payloads(run.id, "approval.objected")] == [("api", "session")]
    assert [door_of(p) for p in payloads(run.id, "approval.changed")] == [("dashboard", "session")]
    [answered] = payloads(run.id, "request.answered")
    assert door_of(answered) == ("dashboard", "session")
    assert [v.via for v in ApprovalVote.objects.filter(request=req).order_by("id")] == [
        "email",
        "api",
        "dashboard",
    ]


def test_pause_continue_and_the_agent_gate_record_the_door(operator: User) -> None:
    run = start(user=operator)
    services.run_pause(run_id=run.id, reason="look", user=operator, **DOOR)
    [asked] = payloads(run.id, "run.pause_requested")
    assert door_of(asked) == ("api", "token:0123456789ab")
    run.refresh_from_db()
    services.run_resume(
        run_id=run.id,
        request_id=run.pending_request_id,
        checkpoint_id=None,
        user=operator,
        via="dashboard",
        identity="session",
    )
    [continued] = payloads(run.id, "run.continued")
    assert door_of(continued) == ("dashboard", "session")
    lease = claim()
    services.agent_pause(
        agent=AGENT, reason="incident", user=operator, via="cli", identity="shell:x"
    )
    [paused] = payloads(lease.run_id, "agent.paused")
    assert door_of(paused) == ("cli", "shell:x") and paused["reason"] == "incident"
    services.checkpoint_save(**epochs(lease), step="next", state={})
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="paused"
    )  # the run waits queued, held by the gate
    services.agent_unpause(agent=AGENT, user=operator, via="api", identity="session")
    [unpaused] = payloads(lease.run_id, "agent.unpaused")
    assert door_of(unpaused) == ("api", "session")


def test_an_expiry_is_the_systems_and_says_no_door() -> None:
    run, _lease, _cp, _req = interrupted(expires_in=60)
    with time_machine.travel(timezone.now() + dt.timedelta(minutes=5), tick=False):
        services.requests_expire()
    events = RunEvent.objects.filter(run_id=run.id, seq__gt=0)
    assert events.filter(type="run.failed").exists()
    assert all("via" not in e.payload and "identity" not in e.payload for e in events)
