"""Approvals for a team over the API (issue 18): edit before approving, send back with a
comment, N distinct approvers, no self-approval, groups, and the request's representation."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command

from runs.approvals import parse_policy
from runs.models import AgentApprovalPolicy, ApprovalVote, InputRequest, Run, RunEvent
from tests.api.conftest import client_for, post
from tests.conftest import _user
from tests.runs.factory import AGENT, interrupted, snapshot

pytestmark = pytest.mark.django_db

EDITABLE = {
    "schema": {"accepted_versions": "string[]", "ttl": "integer"},
    "value": {"accepted_versions": ["v2", "v3"], "ttl": 3600},
}


def approval(policy: dict[str, Any] | None = None, **action: Any) -> tuple[Run, Any, Any]:
    if policy is not None:
        AgentApprovalPolicy.objects.update_or_create(
            agent=AGENT, defaults={"policy": parse_policy(policy)}
        )
    run, _lease, cp, request = interrupted(
        kind="auth_required",
        action={
            "tool": "config_store",
            "target": "staging/auth/config",
            "change": {"accepted_versions": {"from": ["v1", "v2", "v3"], "to": ["v2", "v3"]}},
            "reversibility": action.pop("reversibility", "reversible"),
            **action,
        },
    )
    return run, cp, request


def decide(user: User, run: Run, cp: Any, request: Any, value: Any, key: str) -> Any:
    body = {"request_id": request.id, "checkpoint_id": cp.id, "value": value}
    return post(client_for(user), f"/api/runs/{run.pk}/resume", body, key=key)


def pending(run: Run, user: User) -> dict[str, Any]:
    return client_for(user).get(f"/api/runs/{run.pk}").json()["pending_request"]


# --- Edit, respond ---------------------------------------------------------------------------


def test_an_edit_is_validated_with_the_answers_validator_and_changes_nothing_when_invalid(
    approver,
) -> None:
    run, cp, request = approval(editable=EDITABLE)
    before = snapshot(run.pk)
    response = decide(
        approver,
        run,
        cp,
        request,
        {"decision": "approve", "edited": {"accepted_versions": [], "ttl": "soon"}},
        "bad-edit",
    )
    assert response.status_code == 422
    problem = response.json()
    assert problem["code"] == "invalid_input"
    pointers = {e["pointer"] for e in problem["errors"]}
    # Required means not empty (the same rule as answers), and the type is checked.
    assert pointers == {"/value/edited/accepted_versions", "/value/edited/ttl"}
    assert snapshot(run.pk) == before


def test_an_approval_with_edits_records_the_original_the_edit_and_who(approver) -> None:
    run, cp, request = approval(editable=EDITABLE)
    edited = {"accepted_versions": ["v3"], "ttl": 1800}
    response = decide(
        approver,
        run,
        cp,
        request,
        {"decision": "approve", "comment": "v2 too", "edited": edited},
        "e",
    )
    assert response.status_code == 202
    request.refresh_from_db()
    assert request.status == "answered"
    assert request.answer == {"decision": "approve", "comment": "v2 too", "edited": edited}
    answered = RunEvent.objects.get(run=run, type="request.answered")
    assert answered.payload["original"] == EDITABLE["value"]
    assert answered.payload["answer"]["edited"] == edited
    assert answered.payload["edited_by"] == "alice"
    shown = client_for(approver).get(f"/api/runs/{run.pk}/events").json()
    assert any(e["type"] == "request.answered" and e["payload"]["original"] for e in shown)


def test_an_edit_that_changes_nothing_is_a_plain_approval(approver) -> None:
    run, cp, request = approval(editable=EDITABLE)
    response = decide(
        approver, run, cp, request, {"decision": "approve", "edited": EDITABLE["value"]}, "same"
    )
    assert response.status_code == 202
    request.refresh_from_db()
    assert request.answer == {"decision": "approve"}
    assert request.edited is None


def test_edits_are_refused_where_the_approval_offers_none_and_with_a_denial(approver) -> None:
    run, cp, request = approval()
    response = decide(
        approver, run, cp, request, {"decision": "approve", "edited": {"x": 1}}, "not-editable"
    )
    assert response.status_code == 422
    assert response.json()["errors"] == [{"pointer": "/value/edited", "message": "not editable"}]
    run2, cp2, request2 = approval(editable=EDITABLE)
    response = decide(
        approver,
        run2,
        cp2,
        request2,
        {"decision": "deny", "comment": "no", "edited": EDITABLE["value"]},
        "deny-edit",
    )
    assert response.status_code == 422
    assert InputRequest.objects.filter(status="pending").count() == 2


@pytest.mark.parametrize("decision", ["deny", "respond"])
def test_deny_and_respond_need_a_comment(approver, decision: str) -> None:
    run, cp, request = approval()
    response = decide(approver, run, cp, request, {"decision": decision}, f"{decision}-bare")
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"pointer": "/value/comment", "message": "required to deny or respond"}
    ]
    response = decide(
        approver, run, cp, request, {"decision": decision, "comment": "re-plan for v4"}, decision
    )
    assert response.status_code == 202
    request.refresh_from_db()
    assert request.answer == {"decision": decision, "comment": "re-plan for v4"}


def test_an_agent_asking_with_a_plan_its_own_schema_refuses_is_refused(approver) -> None:
    from runs.errors import HoldpointError

    with pytest.raises(HoldpointError) as refused:
        approval(editable={"schema": {"ttl": "integer"}, "value": {"ttl": "x"}})
    assert refused.value.code == "invalid_input"


# --- Who may approve, and how many -----------------------------------------------------------


def second_approver(name: str = "bob", group: str = "approver") -> User:
    return _user(name, group)


def test_two_approvers_are_needed_and_the_representation_counts_them(approver) -> None:
    bob = second_approver()
    run, cp, request = approval({"required": 2})
    assert pending(run, approver)["approvals_needed"] == 2
    response = decide(approver, run, cp, request, {"decision": "approve", "comment": "ok"}, "a1")
    assert response.status_code == 202
    shown = response.json()["pending_request"]
    assert response.json()["status"] == "auth_required"
    assert shown["approvals_needed"] == 1
    assert shown["policy"]["required"] == 2
    assert [(a["by"], a["decision"], a["comment"], a["counts"]) for a in shown["approvals"]] == [
        ("alice", "approve", "ok", True)
    ]
    given = RunEvent.objects.get(run=run, type="approval.given")
    assert given.payload["approvals"] == 1 and given.payload["required"] == 2
    # The same person again does not count twice.
    response = decide(approver, run, cp, request, {"decision": "approve"}, "a2")
    assert response.status_code == 403
    assert response.json()["code"] == "approval_not_allowed"
    assert response.json()["reason"] == "already_approved"
    response = decide(bob, run, cp, request, {"decision": "approve"}, "b1")
    assert response.status_code == 202
    assert response.json()["status"] == "queued"
    request.refresh_from_db()
    assert request.status == "answered"
    assert request.answer["approvers"] == ["alice", "bob"]


def test_an_edit_resets_the_approvals_given_before_it(approver) -> None:
    bob, carol = second_approver(), second_approver("carol")
    run, cp, request = approval({"required": 2}, editable=EDITABLE)
    assert decide(approver, run, cp, request, {"decision": "approve"}, "a").status_code == 202
    edited = {"accepted_versions": ["v3"], "ttl": 60}
    response = decide(bob, run, cp, request, {"decision": "approve", "edited": edited}, "b")
    assert response.status_code == 202
    shown = response.json()["pending_request"]
    assert shown["approvals_needed"] == 1  # alice approved something else
    assert shown["edited"] == edited
    assert [(a["by"], a["counts"]) for a in shown["approvals"]] == [("alice", False), ("bob", True)]
    # The timeline's event says so: bob's edit (the first) reset alice's approval.
    events = RunEvent.objects.filter(run=run, type="approval.given").order_by("seq")
    assert [(e.payload["by"], e.payload["reset"]) for e in events] == [
        ("alice", False),
        ("bob", True),
    ]
    # Alice may approve again: the edited arguments are new to her.
    response = decide(approver, run, cp, request, {"decision": "approve"}, "a-again")
    assert response.status_code == 202
    request.refresh_from_db()
    assert request.status == "answered"
    assert request.answer["edited"] == edited
    assert request.answer["approvers"] == ["bob", "alice"]
    assert carol.pk  # a third approver was never needed


def test_any_deny_closes_by_default(approver) -> None:
    bob = second_approver()
    run, cp, request = approval({"required": 2})
    decide(approver, run, cp, request, {"decision": "approve"}, "a")
    response = decide(bob, run, cp, request, {"decision": "deny", "comment": "no"}, "b")
    assert response.status_code == 202
    request.refresh_from_db()
    assert request.status == "answered" and request.answer["decision"] == "deny"


def test_a_deny_is_an_objection_when_the_policy_says_any_deny_does_not_close(approver) -> None:
    bob = second_approver()
    run, cp, request = approval({"required": 2, "any_deny_closes": False})
    response = decide(bob, run, cp, request, {"decision": "deny", "comment": "hmm"}, "b2")
    assert response.status_code == 202
    request.refresh_from_db()
    assert request.status == "pending"
    assert RunEvent.objects.filter(run=run, type="approval.objected").count() == 1


def test_no_self_approval_of_an_irreversible_effect_by_default(approver) -> None:
    from runs import services
    from tests.runs.factory import claim, epochs

    run = services.run_start(agent=AGENT, input={"n": 1}, user=approver)
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="send", state={})
    request = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="auth_required",
        prompt="Send?",
        action={"tool": "email", "target": "ops@example.com", "reversibility": "irreversible"},
    )
    assert request.policy["self_approval"] is False
    before = snapshot(run.pk)
    response = decide(approver, run, cp, request, {"decision": "approve"}, "self")
    assert response.status_code == 403
    body = response.json()
    assert body["code"] == "approval_not_allowed"
    assert body["reason"] == "self_approval"
    assert "You started this run" in body["detail"]
    assert snapshot(run.pk) == before
    # Denying one's own run is allowed; another approver may approve.
    bob = second_approver()
    response = decide(bob, run, cp, request, {"decision": "approve"}, "bob")
    assert response.status_code == 202, response.json()


def test_only_the_policys_groups_may_decide(approver) -> None:
    Group.objects.get_or_create(name="release-managers")
    bob = second_approver()
    bob.groups.add(Group.objects.get(name="release-managers"))
    run, cp, request = approval(
        {"rules": [{"match": "config_store:staging/*", "groups": ["release-managers"]}]}
    )
    assert request.policy["rule"] == "config_store:staging/*"
    response = decide(approver, run, cp, request, {"decision": "deny", "comment": "x"}, "a")
    assert response.status_code == 403
    assert response.json()["reason"] == "not_in_group"
    assert "release-managers" in response.json()["detail"]
    assert ApprovalVote.objects.count() == 0
    assert decide(bob, run, cp, request, {"decision": "approve"}, "b").status_code == 202


def test_the_agents_list_shows_each_agents_policy_and_the_command_sets_it(viewer, capsys) -> None:
    call_command("agent", "policy", AGENT, "--required", "2", "--self-approval", "no")
    out = capsys.readouterr().out
    assert "approval policy from operator" in out
    rows = {a["name"]: a for a in client_for(viewer).get("/api/agents").json()}
    assert rows[AGENT]["approval_policy"] == {
        "policy": {"required": 2, "self_approval": False},
        "source": "operator",
    }
    call_command("agent", "policy", AGENT, "--clear")
    rows = {a["name"]: a for a in client_for(viewer).get("/api/agents").json()}
    assert rows[AGENT]["approval_policy"]["source"] == "default"


def test_a_bad_policy_is_refused_by_the_command() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="required must be a whole number"):
        call_command("agent", "policy", AGENT, "--required", "0")
    assert not AgentApprovalPolicy.objects.exists()


def test_the_system_counts_once_too() -> None:
    from runs import services
    from runs.errors import HoldpointError

    run, cp, request = approval({"required": 2})
    resume = {"run_id": run.pk, "request_id": request.id, "checkpoint_id": cp.id}
    services.run_resume(**resume, value={"decision": "approve"}, actor="cli:ops")
    with pytest.raises(HoldpointError) as refused:
        services.run_resume(**resume, value={"decision": "approve"}, actor="cli:ops")
    assert refused.value.code == "approval_not_allowed"
    services.run_resume(**resume, value={"decision": "approve"}, actor="cli:oncall")
    request.refresh_from_db()
    assert request.status == "answered"
    assert request.answer["approvers"] == ["cli:ops", "cli:oncall"]


def test_an_approver_may_edit_what_they_approved_and_approves_the_edit(approver) -> None:
    bob = second_approver()
    run, cp, request = approval({"required": 2}, editable=EDITABLE)
    assert decide(approver, run, cp, request, {"decision": "approve"}, "a").status_code == 202
    edited = {"accepted_versions": ["v3"], "ttl": 60}
    response = decide(approver, run, cp, request, {"decision": "approve", "edited": edited}, "a2")
    assert response.status_code == 202, response.json()
    assert response.json()["pending_request"]["approvals_needed"] == 1
    # The same edit again is no edit: she already approved it.
    response = decide(approver, run, cp, request, {"decision": "approve", "edited": edited}, "a3")
    assert response.status_code == 403 and response.json()["reason"] == "already_approved"
    assert decide(bob, run, cp, request, {"decision": "approve"}, "b").status_code == 202
    request.refresh_from_db()
    assert request.answer["edited"] == edited and request.answer["approvers"] == ["alice", "bob"]


def test_the_command_reads_a_whole_policy_from_a_file_and_refuses_unknown_agents(
    tmp_path, capsys
) -> None:  # type: ignore[no-untyped-def]
    import json

    from django.core.management.base import CommandError

    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"rules": [{"match": "email", "required": 2}]}))
    call_command("agent", "policy", AGENT, "--file", str(path))
    stored = AgentApprovalPolicy.objects.get(agent=AGENT).policy
    assert stored == {"rules": [{"match": "email", "required": 2}]}
    assert '"match": "email"' in capsys.readouterr().out
    with pytest.raises(CommandError, match="no agent named"):
        call_command("agent", "policy", "nobody", "--required", "2")
    path.write_text(json.dumps({"rules": [{"match": "email", "quorum": 2}]}))
    with pytest.raises(CommandError, match="unknown policy fields: quorum"):
        call_command("agent", "policy", AGENT, "--file", str(path))
