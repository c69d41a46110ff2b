"""Issue 24, points 1 and 2: no way around an agent's approval policy.

1. A pre-approval at start is the starter's vote on their own run: it passes the same
   policy as every other vote (groups, N distinct people, no self-approval) or is refused
   with the reason, in ``run_start``, the API, the start form and ``startrun --approve``
   alike, for Python and declared agents; and it is judged again when the step uses it.
2. A tool's reversibility belongs to the agent that declared it (a built-in tool's to the
   server): another agent's declaration of the same name changes nothing, and an approval
   asked without ``action.reversibility`` is judged by the tool, not by the worker's
   silence.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.test import Client

from runs import services
from runs.errors import HoldpointError
from runs.models import Run, RunEvent
from tests.api.conftest import client_for, post, worker_client
from tests.api.test_worker_protocol import claim, declare, fenced, url
from tests.conftest import _user
from tests.runs.factory import AGENT, allow_preapproval, preapprover, snapshot

pytestmark = pytest.mark.django_db

PROBLEM = "application/problem+json"


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def root(db: None) -> User:
    """A superuser who is not in release-managers."""
    return User.objects.create_superuser(username="root", password="pw-root")


def _policy(*args: str) -> None:
    call_command("agent", "policy", AGENT, *args)


def _refused(call: Any, reason: str) -> HoldpointError:
    with pytest.raises(HoldpointError) as refused:
        call()
    assert refused.value.code == "preapproval_not_permitted", refused.value
    assert refused.value.status == 403
    assert refused.value.extra["reason"] == reason, refused.value.extra
    return refused.value


# --- 1. A pre-approval is a vote under the policy --------------------------------------------


def test_a_superuser_outside_the_policys_groups_cannot_pre_approve(root: User) -> None:
    """The issue's finding: two approvers from release-managers, no self-approval; a
    superuser outside the group started a run with the e-mail pre-approved."""
    Group.objects.get_or_create(name="release-managers")
    _policy("--required", "2", "--groups", "release-managers", "--self-approval", "no")
    for approvals in (["approve.approve-v1", "notify.email"], ["notify.email"]):
        response = post(
            client_for(root),
            "/api/runs",
            {"agent": AGENT, "input": {"n": 1}, "approvals": approvals},
            key="pre-" + approvals[0],
        )
        assert response.status_code == 403, response.content[:300]
        assert response["Content-Type"].startswith(PROBLEM)
        body = response.json()
        assert body["code"] == "preapproval_not_permitted" and body["reason"] == "not_in_group"
        assert "release-managers" in body["detail"]
    assert not Run.objects.exists() and not RunEvent.objects.exists()


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        (["--required", "2", "--self-approval", "yes"], "needs_more_approvers"),
        (["--self-approval", "no"], "self_approval"),
        ([], "self_approval"),  # unset: the step may be irreversible, where it is "no"
        (["--groups", "release-managers", "--self-approval", "yes"], "not_in_group"),
    ],
)
def test_the_service_refuses_a_pre_approval_the_policy_does_not_allow(
    approver: User, policy: list[str], reason: str
) -> None:
    Group.objects.get_or_create(name="release-managers")
    if policy:
        _policy(*policy)
    _refused(
        lambda: services.run_start(
            agent=AGENT, input={"n": 1}, user=approver, approvals=["notify.email"]
        ),
        reason,
    )
    assert not Run.objects.exists()


def test_a_rule_of_the_policy_binds_a_pre_approval_too(approver: User) -> None:
    """The step's tool and target are not known at start: every rule could apply."""
    from runs.approvals import parse_policy
    from runs.models import AgentApprovalPolicy

    AgentApprovalPolicy.objects.create(
        agent=AGENT,
        policy=parse_policy(
            {"self_approval": True, "rules": [{"match": "email:*", "required": 2}]}
        ),
    )
    _refused(
        lambda: services.run_start(agent=AGENT, input={"n": 1}, user=approver, approvals=["x"]),
        "needs_more_approvers",
    )


def test_a_member_may_pre_approve_where_the_policy_allows_it(approver: User) -> None:
    Group.objects.get_or_create(name="release-managers")[0].user_set.add(approver)
    _policy("--groups", "release-managers", "--self-approval", "yes")
    run = services.run_start(agent=AGENT, input={"n": 1}, user=approver, approvals=["notify.email"])
    assert run.approvals == ["notify.email"]


def test_the_start_form_says_why_and_refuses_a_forged_field(client: Client) -> None:
    _policy("--required", "2")
    client.force_login(preapprover())  # an admin: may start runs and approve
    page = client.get(f"/runs/new?agent={AGENT}").content.decode()
    assert 'name="approvals"' not in page
    assert "need 2 different people" in page
    refused = client.post(
        "/runs/new",
        {"agent": AGENT, "idempotency_key": "f1", "answer/n": "5", "approvals": "notify.email"},
    )
    assert refused.status_code == 403
    assert "need 2 different people" in refused.content.decode()
    assert not Run.objects.exists()


def test_startrun_approve_is_refused_with_the_reason(approver: User) -> None:
    _policy("--self-approval", "no")
    with pytest.raises(CommandError, match="does not let the person who started a run"):
        call_command(
            "startrun", AGENT, '{"n": 1}', "--approve", "notify.email", "--as", approver.username
        )
    assert not Run.objects.exists()


def test_a_declared_agents_policy_binds_its_own_starter(approver: User) -> None:
    worker = worker_client("w-declare")
    body = {
        "input_schema": {"n": "integer"},
        "tools": [{"name": "pager", "reversibility": "irreversible"}],
        "approval_policy": {"required": 2},
    }
    assert declare(worker, "team-agent", body).status_code == 201
    _refused(
        lambda: services.run_start(
            agent="team-agent", input={"n": 1}, user=approver, approvals=["page.pager"]
        ),
        "needs_more_approvers",
    )


def test_a_pre_approval_no_longer_counts_once_the_policy_forbids_it(approver: User) -> None:
    """Allowed at start; an operator then asks for two approvers. The irreversible e-mail
    is not sent on the starter's word: the ledger asks for an approval, and the lease no
    longer carries the pre-approval."""
    allow_preapproval()
    run = services.run_start(agent=AGENT, input={"n": 1}, user=approver, approvals=["notify.email"])
    _policy("--required", "2", "--self-approval", "yes")
    worker = worker_client("w-late")
    lease = claim(worker)
    assert lease["approvals"] == []
    begin = post(
        worker,
        url(lease, "side-effects"),
        fenced(
            lease,
            step_id="notify.email",
            tool="email",
            target="a@example.com",
            request={"to": ["a@example.com"], "subject": "s", "body": "b"},
        ),
    )
    assert (begin.status_code, begin.json()["code"]) == (409, "approval_required")
    assert run.side_effects.count() == 0


# --- 2. A tool's reversibility is its owner's ---------------------------------------------------


PAGER_A = {
    "input_schema": {"n": "integer"},
    "tools": [{"name": "pager", "reversibility": "irreversible"}],
    "approval_policy": {"ask_before": ["pager"]},
}
PAGER_B = {
    "input_schema": {"n": "integer"},
    "tools": [{"name": "pager", "reversibility": "reversible"}],
}


def test_another_agents_declaration_of_the_same_tool_name_changes_nothing() -> None:
    token_a, token_b = worker_client("token-a"), worker_client("token-b")
    assert declare(token_a, "agent-a", PAGER_A).status_code == 201
    # Declared after A's: it was the "newest declaration" that used to win for everyone.
    assert declare(token_b, "agent-b", PAGER_B).status_code == 201
    services.run_start(agent="agent-a", input={"n": 1})
    lease = claim(token_a, agents=["agent-a"])
    paged = post(
        token_a,
        url(lease, "side-effects"),
        fenced(lease, step_id="page.pager", tool="pager", target="oncall", request={"p": 1}),
    )
    assert (paged.status_code, paged.json()["code"]) == (409, "approval_required")
    # B's own runs use B's declaration.
    services.run_start(agent="agent-b", input={"n": 1})
    lease_b = claim(token_b, agents=["agent-b"])
    acted = post(
        token_b,
        url(lease_b, "side-effects"),
        fenced(lease_b, step_id="page.pager", tool="pager", target="oncall", request={"p": 1}),
    )
    assert acted.status_code == 200 and acted.json()["decision"] == "act"
    assert acted.json()["reversibility"] == "reversible"


def test_an_agent_cannot_use_a_tool_only_another_agent_declared() -> None:
    token_a, token_b = worker_client("token-a"), worker_client("token-b")
    declare(token_a, "agent-a", PAGER_A)
    declare(token_b, "agent-c", {"input_schema": {"n": "integer"}})
    services.run_start(agent="agent-c", input={"n": 1})
    lease = claim(token_b, agents=["agent-c"])
    refused = post(
        token_b,
        url(lease, "side-effects"),
        fenced(lease, step_id="page.pager", tool="pager", target="oncall", request={"p": 1}),
    )
    assert (refused.status_code, refused.json()["code"]) == (422, "invalid_input")
    assert "agent-c" in refused.json()["detail"]


def test_a_built_in_tool_stays_irreversible_whatever_a_declaration_says() -> None:
    worker = worker_client("token-mail")
    body = {
        "input_schema": {"n": "integer"},
        "tools": [{"name": "email", "reversibility": "reversible"}],
    }
    assert declare(worker, "mailer", body).status_code == 201
    services.run_start(agent="mailer", input={"n": 1})
    lease = claim(worker, agents=["mailer"])
    mail = {"to": ["all@example.com"], "subject": "s"}

    def begin(**extra: Any) -> Any:
        return post(
            worker,
            url(lease, "side-effects"),
            fenced(
                lease,
                step_id="notify.email",
                tool="email",
                target="all@example.com",
                request=mail,
                **extra,
            ),
        )

    asks = begin()
    assert (asks.status_code, asks.json()["code"]) == (409, "approval_required")
    # Saying so on the call changes nothing either: the e-mail tool cannot undo a message.
    says = begin(reversibility="reversible")
    assert (says.status_code, says.json()["code"]) == (422, "invalid_input")


def test_an_approval_of_the_email_tool_without_reversibility_forbids_self_approval(
    approver: User,
) -> None:
    """What the Python client sends for ``ctx.approve(tool="email")``: no reversibility.
    The server judges the e-mail tool irreversible, so by default the starter may not
    approve it."""
    run = services.run_start(agent=AGENT, input={"n": 1}, user=approver)
    worker = worker_client("w-approve")
    lease = claim(worker)
    saved = post(worker, url(lease, "checkpoint"), fenced(lease, step="notify", state={}))
    asked = post(
        worker,
        url(lease, "interrupt"),
        fenced(
            lease,
            checkpoint_id=saved.json()["checkpoint_id"],
            kind="auth_required",
            prompt="Send it?",
            step_id="notify.approve",
            action={"tool": "email", "target": "all@example.com", "reversibility": "reversible"},
        ),
    )
    assert asked.status_code == 201, asked.content
    request = run.input_requests.get()
    assert request.action["reversibility"] == "irreversible"
    assert request.policy["self_approval"] is False
    before = snapshot(run.pk)
    mine = post(
        client_for(approver),
        f"/api/runs/{run.pk}/resume",
        {
            "request_id": request.id,
            "checkpoint_id": request.checkpoint_id,
            "value": {"decision": "approve"},
        },
        key="self",
    )
    assert mine.status_code == 403 and mine.json()["reason"] == "self_approval"
    assert snapshot(run.pk) == before


def test_an_edit_of_a_tool_request_must_fit_the_tools_request_schema(approver: User) -> None:
    """The e-mail tool's edit form allows more than the tool takes (no extra fields in its
    request schema): an edit the tool would refuse is refused when it is made."""
    run = services.run_start(agent=AGENT, input={"n": 1})
    worker = worker_client("w-edit")
    lease = claim(worker)
    saved = post(worker, url(lease, "checkpoint"), fenced(lease, step="notify", state={}))
    plan = {"to": ["all@example.com"], "subject": "s"}
    post(
        worker,
        url(lease, "interrupt"),
        fenced(
            lease,
            checkpoint_id=saved.json()["checkpoint_id"],
            kind="auth_required",
            prompt="Send it?",
            step_id="notify.email",
            action={
                "tool": "email",
                "target": "all@example.com",
                "change": plan,
                "editable": {"schema": {"type": "object"}, "value": plan},
            },
        ),
    )
    request = run.input_requests.get()
    assert request.action["editable"]["request_schema"]["additionalProperties"] is False
    before = snapshot(run.pk)
    edited = {**plan, "reply_to": "evil@example.com"}
    refused = post(
        client_for(approver),
        f"/api/runs/{run.pk}/resume",
        {
            "request_id": request.id,
            "checkpoint_id": request.checkpoint_id,
            "value": {"decision": "approve", "edited": edited},
        },
        key="edit",
    )
    assert refused.status_code == 422 and refused.json()["code"] == "invalid_input"
    assert snapshot(run.pk) == before


def test_a_superuser_outside_the_groups_cannot_vote_either(root: User) -> None:
    from tests.api.test_team_approvals import approval, decide

    Group.objects.get_or_create(name="release-managers")
    run, cp, request = approval({"groups": ["release-managers"]})
    response = decide(root, run, cp, request, {"decision": "approve"}, "root")
    assert response.status_code == 403 and response.json()["reason"] == "not_in_group"
    member = _user("mia", "approver")
    member.groups.add(Group.objects.get(name="release-managers"))
    assert decide(member, run, cp, request, {"decision": "approve"}, "mia").status_code == 202
