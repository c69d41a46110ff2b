"""Issue 25, point 4: worker tokens are trusted with only their own agents.

An agent belongs to the token (or tokens) that first declared it: others get 403
``agent_not_yours``, and an administrator can move it. A token can be scoped to agents:
claims, declarations and side-effect outcomes only for those. Today's finding: token B
re-declared token A's ``team-agent`` with ``{required: 1, self_approval: true}``, and
could claim A's runs and read their input.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from ledger.models import SideEffect
from runs import services
from runs.agents import approval_policy_for
from runs.models import DeclaredAgent, RunEvent, WorkerToken
from runs.tokens import worker_token_create
from tests.api.conftest import post, worker_client
from tests.api.test_worker_protocol import claim, declare, fenced, url
from tests.runs.factory import snapshot

pytestmark = pytest.mark.django_db

TEAM = {
    "input_schema": {"secret": "string"},
    "tools": [{"name": "folder", "reversibility": "compensable"}],
    "approval_policy": {"required": 2, "self_approval": False},
}


def problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content[:400]
    assert response["Content-Type"].startswith("application/problem+json")
    body = response.json()
    assert body["code"] == code
    return body


def test_another_token_cannot_redeclare_an_agent_and_weaken_its_policy() -> None:
    token_a, token_b = worker_client("token-a"), worker_client("token-b")
    assert declare(token_a, "team-agent", TEAM).status_code == 201
    assert DeclaredAgent.objects.get(name="team-agent").owners == ["token-a"]
    weakened = {**TEAM, "approval_policy": {"required": 1, "self_approval": True}}
    body = problem(declare(token_b, "team-agent", weakened), 403, "agent_not_yours")
    assert body["reason"] == "owned_by_others" and "token-a" in body["detail"]
    assert approval_policy_for("team-agent")[0] == {"required": 2, "self_approval": False}
    # The owner may declare it again (its workers restart), as before.
    assert declare(token_a, "team-agent", TEAM).status_code == 200


def test_an_administrators_agent_is_no_tokens_to_redeclare() -> None:
    services.agent_declare(name="admin-agent", actor="cli", input_schema={"n": "integer"})
    body = problem(declare(worker_client("token-a"), "admin-agent", TEAM), 403, "agent_not_yours")
    assert "an administrator" in body["detail"]


def test_another_token_cannot_claim_an_owned_agents_runs_or_read_their_input() -> None:
    token_a, token_b = worker_client("token-a"), worker_client("token-b")
    declare(token_a, "team-agent", TEAM)
    run = services.run_start(agent="team-agent", input={"secret": "s3cr3t"})
    # Asking for the agent by name is refused with the reason; asking for anything is 204.
    problem(
        post(token_b, "/api/worker/claim", {"worker_id": "b", "agents": ["team-agent"]}),
        403,
        "agent_not_yours",
    )
    anything = post(token_b, "/api/worker/claim", {"worker_id": "b"})
    assert anything.status_code == 204, anything.content[:300]
    assert not RunEvent.objects.filter(run=run, type="attempt.claimed").exists()
    lease = claim(token_a, agents=["team-agent"])
    assert lease["input"] == {"secret": "s3cr3t"}


def test_an_administrator_moves_an_agent_to_another_token(capsys: Any) -> None:
    token_a, token_b = worker_client("token-a"), worker_client("token-b")
    declare(token_a, "team-agent", TEAM)
    call_command("agent", "owners", "team-agent", "--add", "token-b", "--remove", "token-a")
    assert "owned by token-b" in capsys.readouterr().out
    assert declare(token_b, "team-agent", TEAM).status_code == 200
    problem(declare(token_a, "team-agent", TEAM), 403, "agent_not_yours")
    services.run_start(agent="team-agent", input={"secret": "x"})
    assert claim(token_b, agents=["team-agent"])["agent"] == "team-agent"


def test_a_scoped_token_serves_only_its_agents() -> None:
    _, secret = worker_token_create(name="scoped", agents=["triage"])
    from rest_framework.test import APIClient

    scoped = APIClient()
    scoped.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    body = problem(declare(scoped, "deploy", TEAM), 403, "agent_not_yours")
    assert body["reason"] == "not_in_scope"
    assert not DeclaredAgent.objects.filter(name="deploy").exists()
    assert declare(scoped, "triage", TEAM).status_code == 201
    # Another agent's run (an unowned declared agent, open to unscoped tokens) is not its.
    services.agent_declare(name="open-agent", actor="cli", input_schema={"secret": "string"})
    services.run_start(agent="open-agent", input={"secret": "x"})
    assert post(scoped, "/api/worker/claim", {"worker_id": "s"}).status_code == 204
    problem(
        post(scoped, "/api/worker/claim", {"worker_id": "s", "agents": ["open-agent"]}),
        403,
        "agent_not_yours",
    )
    services.run_start(agent="triage", input={"secret": "y"})
    assert claim(scoped)["agent"] == "triage"


def test_a_token_may_not_report_outcomes_of_another_tokens_agent() -> None:
    token_a, token_b = worker_client("token-a"), worker_client("token-b")
    declare(token_a, "team-agent", TEAM)
    run = services.run_start(agent="team-agent", input={"secret": "x"})
    lease = claim(token_a, agents=["team-agent"])
    begun = post(
        token_a,
        url(lease, "side-effects"),
        fenced(lease, step_id="write.folder", tool="folder", target="f", request={"a": 1}),
    )
    operation_id = begun.json()["operation_id"]
    before = snapshot(run.pk)
    forged = post(token_b, f"/api/worker/side-effects/{operation_id}/outcome", {"status": "failed"})
    problem(forged, 403, "agent_not_yours")
    assert snapshot(run.pk) == before
    assert SideEffect.objects.get(pk=operation_id).status == "pending"
    # Its own worker's outcome is recorded.
    mine = post(
        token_a,
        f"/api/worker/side-effects/{operation_id}/outcome",
        {"status": "confirmed", "external_reference": "f@1"},
    )
    assert mine.status_code == 200, mine.content[:300]


def test_workertoken_shows_and_sets_the_scope(capsys: Any) -> None:
    call_command("workertoken", "create", "host-a", "--agents", "triage,deploy")
    capsys.readouterr()
    assert WorkerToken.objects.get(name="host-a").agents == ["triage", "deploy"]
    call_command("workertoken", "list")
    assert "triage, deploy" in capsys.readouterr().out
    call_command("workertoken", "scope", "host-a", "--any")
    assert WorkerToken.objects.get(name="host-a").agents == []
    call_command("workertoken", "list")
    assert "any agent no other token owns" in capsys.readouterr().out
