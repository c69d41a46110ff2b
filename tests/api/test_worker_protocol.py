"""The finished worker protocol (api/worker_protocol.py): the long-polling claim and its
answers, log, cost, and agents declared over the API with versions."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger.models import SideEffect
from runs import services
from runs.models import AgentVersion, Attempt, DeclaredAgent, Run, RunEvent
from tests.api.conftest import client_for, post, worker_client
from tests.runs.factory import snapshot, start
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db


def fenced(lease: dict[str, Any], **body: Any) -> dict[str, Any]:
    return {"lease_epoch": lease["lease_epoch"], "cancel_epoch": lease["cancel_epoch"], **body}


def url(lease: dict[str, Any], action: str) -> str:
    return f"/api/worker/attempts/{lease['attempt_id']}/{action}"


def claim(worker: APIClient, **body: Any) -> dict[str, Any]:
    response = post(worker, "/api/worker/claim", {"worker_id": "remote-1", **body})
    assert response.status_code == 200, response.content
    return response.json()


def declare(worker: APIClient, name: str, body: dict[str, Any]) -> Any:
    return worker.put(f"/api/agents/{name}", body, format="json")


TRIAGE = {
    "input_schema": {"ticket": "string"},
    "label": "Triage {ticket}",
    "description": "Ticket triage (remote)",
    "retry_policy": {"max_attempts": 3},
    "tools": [
        {"name": "crm_note", "reversibility": "compensable", "description": "A CRM note"},
        {"name": "pager", "reversibility": "irreversible"},
    ],
    "approval_policy": {"ask_before": ["pager"]},
}


# --- The long poll ----------------------------------------------------------------------------


def test_a_claim_without_work_waits_then_answers_204(wclient) -> None:
    response = post(wclient, "/api/worker/claim", {"worker_id": "w", "wait": 0.3})
    assert response.status_code == 204


@pytest.mark.django_db(transaction=True)
def test_a_waiting_claim_is_woken_by_a_new_run_and_leases_it() -> None:
    worker = worker_client("long-poll")
    got: dict[str, Any] = {}

    def poll() -> None:
        from django.db import connection

        try:
            response = post(worker, "/api/worker/claim", {"worker_id": "lp", "wait": 30})
            got["status"] = response.status_code
            got["body"] = response.json() if response.status_code == 200 else None
        finally:
            connection.close()

    thread = threading.Thread(target=poll)
    thread.start()
    threading.Event().wait(0.5)  # The poll is waiting now: nothing was due.
    assert "status" not in got
    run = start()
    thread.join(20)
    assert not thread.is_alive(), "the waiting claim was not woken by the new run"
    assert got["status"] == 200
    assert got["body"]["run_id"] == run.id
    assert got["body"]["answers"] == [] and got["body"]["run_cost"] == "0"


@pytest.mark.django_db(transaction=True)
def test_a_server_shutting_down_answers_its_waiting_claims_at_once() -> None:
    """Ctrl-C on ``serve`` releases the waiter (a Twisted "before shutdown" trigger): a
    long poll answers 204 now rather than holding the shutdown for its whole wait."""
    from runs.wakeups import waiter

    worker = worker_client("long-poll")
    got: dict[str, Any] = {}

    def poll() -> None:
        from django.db import connection

        try:
            got["status"] = post(worker, "/api/worker/claim", {"worker_id": "lp", "wait": 30})
        finally:
            connection.close()

    thread = threading.Thread(target=poll)
    thread.start()
    try:
        threading.Event().wait(0.5)  # The poll is waiting now: nothing was due.
        assert "status" not in got
        waiter.release_waiters()
        thread.join(5)
        assert not thread.is_alive(), "the waiting claim kept waiting through the shutdown"
        assert got["status"].status_code == 204
    finally:
        waiter.shutting_down.clear()
        thread.join(30)


def test_a_refused_wait_changes_nothing(wclient) -> None:
    run = start()
    before = snapshot(run.id)
    response = post(wclient, "/api/worker/claim", {"worker_id": "w", "wait": 61})
    assert response.status_code == 422
    assert response["Content-Type"].startswith("application/problem+json")
    assert response.json()["errors"][0]["pointer"] == "/wait"
    assert snapshot(run.id) == before


def test_a_resumed_lease_carries_every_answer_on_its_checkpoint(operator, wclient) -> None:
    run = start()
    lease = claim(wclient)
    saved = post(wclient, url(lease, "checkpoint"), fenced(lease, step="plan", state={"a": 1}))
    checkpoint_id = saved.json()["checkpoint_id"]
    asked = post(
        wclient,
        url(lease, "interrupt"),
        fenced(
            lease,
            checkpoint_id=checkpoint_id,
            kind="input_required",
            prompt="Which versions?",
            accepted_schema={"versions": "string[]"},
            step_id="plan.ask",
            context={"observed": {"config": {"fingerprint": "abc", "value": 3}}},
        ),
    )
    assert asked.status_code == 201
    services.run_resume(
        run_id=run.id,
        request_id=asked.json()["request_id"],
        checkpoint_id=checkpoint_id,
        value={"versions": ["v2"]},
        user=operator,
    )
    lease = claim(wclient)
    assert lease["resume_from"]["step"] == "plan"
    [answer] = lease["answers"]
    assert answer["step_id"] == "plan.ask"
    assert answer["answer"] == {"versions": ["v2"]}
    assert answer["answered_by"] == "olivia"
    assert answer["context"]["observed"]["config"]["fingerprint"] == "abc"


# --- Log and cost -------------------------------------------------------------------------------


def test_a_log_line_goes_on_the_timeline_and_is_fenced(wclient) -> None:
    run = start()
    lease = claim(wclient)
    logged = post(
        wclient,
        url(lease, "log"),
        fenced(lease, message="fetched 3 tickets", level="info", step="plan", data={"n": 3}),
    )
    assert logged.status_code == 201
    event = RunEvent.objects.get(run=run, type="agent.log")
    assert event.payload["message"] == "fetched 3 tickets"
    assert event.payload["data"] == {"n": 3}

    before = snapshot(run.id)
    stale = post(wclient, url(lease, "log"), {**fenced(lease, message="x"), "lease_epoch": 0})
    assert stale.status_code == 409
    assert stale.json()["code"] == "stale_worker"
    bad = post(wclient, url(lease, "log"), fenced(lease, message="x", level="loud"))
    assert bad.status_code == 422
    assert snapshot(run.id) == before


def test_cost_is_recorded_as_a_running_total(wclient) -> None:
    run = start()
    lease = claim(wclient)
    first = post(wclient, url(lease, "cost"), fenced(lease, cost="0.25"))
    assert first.status_code == 200, first.content
    second = post(wclient, url(lease, "cost"), fenced(lease, cost="0.75"))
    assert second.json()["run_cost"] == "0.750000"
    assert Attempt.objects.get(pk=lease["attempt_id"]).cost == Decimal("0.75")
    assert Run.objects.get(pk=run.id).cost == Decimal("0.75")
    assert post(wclient, url(lease, "cost"), fenced(lease, cost="-1")).status_code == 422


# --- Watching for cancel and pause --------------------------------------------------------------


def test_a_watch_without_wait_is_a_heartbeat(wclient) -> None:
    run = start()
    lease = claim(wclient, lease_seconds=30)
    before = Attempt.objects.get(pk=lease["attempt_id"]).lease_expires_at
    watched = post(wclient, url(lease, "watch"), {"lease_epoch": lease["lease_epoch"]})
    assert watched.status_code == 200, watched.content
    assert watched.json()["cancel_requested"] is False
    assert Attempt.objects.get(pk=lease["attempt_id"]).lease_expires_at >= before
    stale = post(wclient, url(lease, "watch"), {"lease_epoch": 0})
    assert (stale.status_code, stale.json()["code"]) == (409, "stale_worker")
    other = post(worker_client("another"), url(lease, "watch"), {"lease_epoch": 1})
    assert (other.status_code, other.json()["code"]) == (409, "not_your_lease")
    assert post(wclient, url(lease, "watch"), {"lease_epoch": 1, "wait": 61}).status_code == 422
    assert Run.objects.get(pk=run.id).status == "running"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stop", ["cancel", "pause"])
def test_a_waiting_watch_hears_a_cancel_or_a_pause_at_once(stop: str, operator) -> None:
    worker = worker_client(f"watcher-{stop}")
    run = start()
    lease = claim(worker, lease_seconds=60)
    got: dict[str, Any] = {}

    def watch() -> None:
        from django.db import connection

        try:
            got["body"] = post(
                worker, url(lease, "watch"), {"lease_epoch": lease["lease_epoch"], "wait": 30}
            ).json()
        finally:
            connection.close()

    thread = threading.Thread(target=watch)
    thread.start()
    threading.Event().wait(0.5)
    assert "body" not in got  # waiting: nothing happened yet
    if stop == "cancel":
        services.run_cancel(run_id=run.id, user=operator, reason="stop")
    else:
        services.run_pause(run_id=run.id, user=operator, reason="look")
    thread.join(15)
    assert not thread.is_alive(), "the watch did not hear it before its 30 s were over"
    assert got["body"][f"{stop}_requested"] is True


# --- Declaring agents ---------------------------------------------------------------------------


def test_an_agent_is_declared_and_versioned_by_its_input_schema(operator, wclient) -> None:
    created = declare(wclient, "triage", TRIAGE)
    assert created.status_code == 201, created.content
    assert created.json()["version"] == 1
    assert created.json()["tools"][0]["reversibility"] == "compensable"
    person = client_for(operator)
    first = post(person, "/api/runs", {"agent": "triage", "input": {"ticket": "T-1"}})
    assert first.status_code == 201, first.content
    # The declared label template names the run where people read.
    assert Run.objects.get(pk=first.json()["run_id"]).label == "Triage T-1"

    # Same schema, new description: the same version, updated.
    same = declare(wclient, "triage", {**TRIAGE, "description": "Triage v1.1"})
    assert (same.status_code, same.json()["version"], same.json()["new_version"]) == (
        200,
        1,
        False,
    )
    # A new input schema is a new version; the run started before keeps its own.
    changed = declare(
        wclient, "triage", {**TRIAGE, "input_schema": {"ticket": "string", "n": "integer"}}
    )
    assert (changed.json()["version"], changed.json()["new_version"]) == (2, True)
    second = post(person, "/api/runs", {"agent": "triage", "input": {"ticket": "T-2", "n": 1}})
    assert second.status_code == 201
    versions = dict(Run.objects.values_list("pk", "agent_version"))
    assert versions[first.json()["run_id"]] == 1
    assert versions[second.json()["run_id"]] == 2
    assert AgentVersion.objects.filter(agent="triage").count() == 2
    assert AgentVersion.objects.get(agent="triage", version=1).description == "Triage v1.1"
    listed = client_for(operator).get("/api/agents").json()
    [triage] = [a for a in listed if a["name"] == "triage"]
    assert (triage["source"], triage["version"]) == ("declared", 2)

    # The lease names the version its run started with.
    lease = claim(wclient, agents=["triage"])
    assert lease["agent_version"] in (1, 2)
    assert lease["agent_version"] == versions[lease["run_id"]]


def test_a_declaration_is_refused_whole(wclient, operator) -> None:
    bad_tool = declare(wclient, "triage", {**TRIAGE, "tools": [{"name": "x y"}]})
    assert bad_tool.status_code == 422
    assert bad_tool["Content-Type"].startswith("application/problem+json")
    bad_schema = declare(wclient, "triage", {**TRIAGE, "input_schema": {"n": "not-a-type"}})
    assert bad_schema.status_code == 422
    assert bad_schema.json()["errors"][0]["pointer"].startswith("/input_schema")
    bad_policy = declare(wclient, "triage", {**TRIAGE, "approval_policy": {"ask_before": ["nope"]}})
    assert bad_policy.status_code == 422
    bad_retry = declare(wclient, "triage", {**TRIAGE, "retry_policy": {"max_attempts": 0}})
    assert bad_retry.status_code == 422
    python_agent = declare(wclient, "test-agent", TRIAGE)
    assert (python_agent.status_code, python_agent.json()["code"]) == (409, "invalid_state")
    assert not DeclaredAgent.objects.exists() and not AgentVersion.objects.exists()
    # People cannot declare agents; workers cannot read the control API.
    person = client_for(operator).put("/api/agents/triage", TRIAGE, format="json")
    assert person.status_code in (401, 403)
    anonymous = APIClient().put("/api/agents/triage", TRIAGE, format="json")
    assert anonymous.status_code == 401


def test_a_declared_tool_goes_through_the_ledger(wclient) -> None:
    declare(wclient, "triage", TRIAGE)
    services.run_start(agent="triage", input={"ticket": "T-9"})
    lease = claim(wclient, agents=["triage"])
    begin = post(
        wclient,
        url(lease, "side-effects"),
        fenced(lease, step_id="note.crm_note", tool="crm_note", target="T-9", request={"t": 1}),
    )
    assert begin.status_code == 200, begin.content
    assert begin.json()["decision"] == "act"
    assert begin.json()["reversibility"] == "compensable"
    # An irreversible declared tool needs its approval first, as the shipped ones do.
    paged = post(
        wclient,
        url(lease, "side-effects"),
        fenced(lease, step_id="note.pager", tool="pager", target="oncall", request={"p": 1}),
    )
    assert (paged.status_code, paged.json()["code"]) == (409, "approval_required")
    assert SideEffect.objects.filter(tool="crm_note", status="pending").count() == 1


def test_declaring_is_throttled_per_token(wclient, settings) -> None:
    settings.HOLDPOINT_THROTTLE_WORKER = "2/minute"
    statuses = [declare(wclient, "triage", TRIAGE).status_code for _ in range(3)]
    assert statuses[-1] == 429


def test_a_remote_agent_declares_who_may_approve_and_how_many(wclient, operator) -> None:
    """``approval_policy`` of a declaration carries both the client's ``ask_before`` and
    the team policy a Python agent gives with ``approval_policy=`` (issue 18): two
    approvers from the approver group; a wrong field is refused whole."""
    from runs.agents import approval_policy_for

    policy = {"ask_before": ["pager"], "required": 2, "groups": ["approver"]}
    created = declare(wclient, "triage", {**TRIAGE, "approval_policy": policy})
    assert created.status_code == 201, created.content
    assert created.json()["approval_policy"] == {
        "ask_before": ["pager"],
        "required": 2,
        "groups": ["approver"],
    }
    assert approval_policy_for("triage") == ({"required": 2, "groups": ["approver"]}, "code")
    shown = [a for a in client_for(operator).get("/api/agents").json() if a["name"] == "triage"]
    assert shown[0]["approval_policy"]["policy"]["required"] == 2
    bad = declare(wclient, "triage", {**TRIAGE, "approval_policy": {"required": 0}})
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_input"
    assert approval_policy_for("triage")[0]["required"] == 2  # the refused one changed nothing


def test_a_runs_representation_names_its_agents_version(wclient, operator) -> None:
    """Issue 25, point 3: ``GET /api/runs/{id}`` carries ``agent_version``."""
    declare(wclient, "triage", TRIAGE)
    first = services.run_start(agent="triage", input={"ticket": "T-1"})
    declare(
        wclient, "triage", {**TRIAGE, "input_schema": {"ticket": "string", "urgent": "boolean?"}}
    )
    second = services.run_start(agent="triage", input={"ticket": "T-2"})
    person = client_for(operator)
    assert person.get(f"/api/runs/{first.pk}").json()["agent_version"] == 1
    assert person.get(f"/api/runs/{second.pk}").json()["agent_version"] == 2
    assert person.get(f"/api/runs/{start().pk}").json()["agent_version"] is None  # a Python agent


@pytest.mark.django_db(transaction=True)
def test_waiting_claims_are_capped_per_token_and_per_address(settings) -> None:
    """Issue 25, point 8: one token held 150 waiting claims (150 threads, ~150 claim
    queries a second). Past the cap a claim is answered 429 with Retry-After at once, and
    claims that do not wait, or of another token, still go through."""
    from api.worker_protocol import waiting_claims
    from runs.wakeups import waiter

    settings.HOLDPOINT_WAITING_CLAIMS_PER_TOKEN = 2
    settings.HOLDPOINT_WAITING_CLAIMS_PER_ADDRESS = 3
    greedy, other, third = worker_client("greedy"), worker_client("other"), worker_client("third")
    got: list[int] = []

    def poll(worker: APIClient) -> None:
        from django.db import connection

        try:
            got.append(
                post(worker, "/api/worker/claim", {"worker_id": "g", "wait": 30}).status_code
            )
        finally:
            connection.close()

    def waiting(key: str) -> int:
        return waiting_claims._counts.get(key, 0)

    threads = [threading.Thread(target=poll, args=(w,)) for w in (greedy, greedy, other)]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: waiting("address:127.0.0.1") >= 3,
            60,
            "three long polls",
            give_up=True,  # the next line says which are missing
        )
        assert (waiting("token:greedy"), waiting("token:other")) == (2, 1)
        refused = post(greedy, "/api/worker/claim", {"worker_id": "g", "wait": 30})
        assert refused.status_code == 429 and refused.json()["code"] == "throttled"
        assert int(refused["Retry-After"]) >= 1
        assert "worker token" in refused.json()["detail"]
        # The address is full too: a third token waiting from it is refused as well.
        by_address = post(third, "/api/worker/claim", {"worker_id": "t", "wait": 30})
        assert by_address.status_code == 429 and "address" in by_address.json()["detail"]
        # A claim that does not wait is never refused for the cap.
        assert post(greedy, "/api/worker/claim", {"worker_id": "g"}).status_code == 204
    finally:
        waiter.release_waiters()
        for thread in threads:
            thread.join(30)
        waiter.shutting_down.clear()
    assert got == [204, 204, 204]
    assert waiting("token:greedy") == waiting("address:127.0.0.1") == 0
