"""The control API: representations, filters, pagination, and the three control operations."""

from __future__ import annotations

import pytest
from django.test import override_settings

from runs import services
from runs.models import DeclaredAgent, Run
from tests.api.conftest import client_for, post
from tests.runs.factory import claim, epochs, interrupted, start

pytestmark = pytest.mark.django_db


def test_it_shows_a_run_as_designed(viewer) -> None:
    run, _lease, cp, request = interrupted()
    body = client_for(viewer).get(f"/api/runs/{run.pk}").json()
    assert {
        "run_id",
        "agent",
        "status",
        "failure_class",
        "cancel_epoch",
        "lease_epoch",
        "current_attempt",
        "latest_checkpoint_id",
        "pending_request",
        "input",
        "result",
        "cost",
        "created_at",
        "updated_at",
    } <= body.keys()
    assert (body["run_id"], body["status"], body["latest_checkpoint_id"]) == (
        run.pk,
        "input_required",
        cp.id,
    )
    pending = body["pending_request"]
    assert (pending["request_id"], pending["checkpoint_id"], pending["kind"]) == (
        request.id,
        cp.id,
        "input_required",
    )
    assert pending["prompt"] == "请选择需要保持兼容的 Token 版本"
    assert body["current_attempt"]["status"] == "interrupted"
    assert body["created_at"].endswith("Z") and pending["expires_at"].endswith("Z")


@override_settings(TIME_ZONE="Asia/Shanghai")
def test_it_gives_times_in_utc_whatever_the_time_zone(viewer) -> None:
    run = start()
    created = client_for(viewer).get(f"/api/runs/{run.pk}").json()["created_at"]
    assert created.endswith("Z") and "+08:00" not in created


def test_it_filters_and_pages_runs_by_cursor(viewer) -> None:
    runs = [start() for _ in range(5)]
    services.run_cancel(run_id=runs[0].pk)
    client = client_for(viewer)
    page = client.get("/api/runs?page_size=2").json()
    seen = [r["run_id"] for r in page["results"]]
    while page["next"]:
        page = client.get(page["next"]).json()
        seen += [r["run_id"] for r in page["results"]]
    assert seen == [r.pk for r in reversed(runs)]
    cancelled = client.get("/api/runs?status=cancelled").json()["results"]
    assert [r["run_id"] for r in cancelled] == [runs[0].pk]
    assert client.get("/api/runs?agent=other").json()["results"] == []


def test_it_refuses_bad_filters_and_cursors(viewer) -> None:
    client = client_for(viewer)
    response = client.get("/api/runs?status=sleeping&page_size=0")
    assert response.status_code == 422
    assert {e["pointer"] for e in response.json()["errors"]} == {"/status", "/page_size"}
    response = client.get("/api/runs?cursor=garbage")
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/cursor"


def test_it_lists_attempts_events_after_a_seq_and_checkpoints(viewer) -> None:
    run, _lease, cp, _request = interrupted()
    client = client_for(viewer)
    attempts = client.get(f"/api/runs/{run.pk}/attempts").json()
    assert [(a["number"], a["status"], a["error"]) for a in attempts] == [(1, "interrupted", None)]
    events = client.get(f"/api/runs/{run.pk}/events").json()
    assert [e["seq"] for e in events] == [1, 2, 3, 4]
    later = client.get(f"/api/runs/{run.pk}/events?after=2&limit=1").json()
    assert [(e["seq"], e["type"]) for e in later] == [(3, "checkpoint.saved")]
    assert client.get(f"/api/runs/{run.pk}/events?after=-1").status_code == 422
    checkpoints = client.get(f"/api/runs/{run.pk}/checkpoints").json()
    assert [(c["checkpoint_id"], c["step"], c["state"]) for c in checkpoints] == [
        (cp.id, "ask", {"seen": 1})
    ]


def test_it_lists_the_inbox_soonest_expiry_first(viewer) -> None:
    late = interrupted(expires_in=7200)[3]
    soon = interrupted(expires_in=600)[3]
    client = client_for(viewer)
    inbox = client.get("/api/input-requests").json()["results"]
    assert [r["request_id"] for r in inbox] == [soon.id, late.id]
    assert client.get("/api/input-requests?status=answered").json()["results"] == []
    only = client.get(f"/api/input-requests?run_id={late.run_id}").json()["results"]
    assert [r["request_id"] for r in only] == [late.id]


def test_it_lists_python_and_declared_agents(viewer) -> None:
    DeclaredAgent.objects.create(
        name="go-triage", input_schema={"type": "object"}, retry_policy={"max_attempts": 2}
    )
    agents = {a["name"]: a for a in client_for(viewer).get("/api/agents").json()}
    assert agents["test-agent"]["source"] == "python"
    assert agents["test-agent"]["retry_policy"]["non_retryable"] == ["ValueError"]
    assert agents["go-triage"]["source"] == "declared"
    assert agents["go-triage"]["retry_policy"]["max_attempts"] == 2


def test_it_starts_a_run_of_a_declared_agent_and_validates_its_input(operator) -> None:
    DeclaredAgent.objects.create(
        name="go-triage",
        input_schema={"type": "object", "required": ["ticket"]},
    )
    client = client_for(operator)
    refused = post(client, "/api/runs", {"agent": "go-triage", "input": {}})
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["pointer"] == "/input/ticket"
    started = post(client, "/api/runs", {"agent": "go-triage", "input": {"ticket": 7}})
    assert started.status_code == 201
    body = started.json()
    assert (body["agent"], body["status"], body["current_attempt"]["reason"]) == (
        "go-triage",
        "queued",
        "initial",
    )
    assert Run.objects.get(pk=body["run_id"]).created_by == operator


def test_it_answers_cancel_requested_while_a_lease_is_live(operator) -> None:
    run = start()
    claim()
    response = post(client_for(operator), f"/api/runs/{run.pk}/cancel", {"reason": "no"}, key="c")
    assert response.status_code == 202
    body = response.json()
    assert (body["status"], body["cancel_epoch"], body["cancel_reason"]) == (
        "cancel_requested",
        1,
        "no",
    )


def test_it_cancels_a_waiting_question_at_once(operator) -> None:
    run = interrupted()[0]
    body = post(client_for(operator), f"/api/runs/{run.pk}/cancel", key="c").json()
    assert (body["status"], body["failure_class"], body["pending_request"]) == (
        "cancelled",
        "cancelled",
        None,
    )


def test_it_retries_from_a_chosen_checkpoint(operator) -> None:
    run = start()
    lease = claim()
    first = services.checkpoint_save(**epochs(lease), step="one", state={"i": 1})
    services.checkpoint_save(**epochs(lease), step="two", state={"i": 2})
    services.attempt_fail(**epochs(lease), error={"type": "ValueError", "message": "bad"})
    body = {"reason": "fixed the config", "from_checkpoint": first.id}
    response = post(client_for(operator), f"/api/runs/{run.pk}/retry", body, key="r")
    assert response.status_code == 202
    retried = response.json()
    assert (retried["status"], retried["latest_checkpoint_id"]) == ("queued", first.id)
    assert retried["current_attempt"]["reason"] == "retry"
    assert retried["current_attempt"]["resume_from"] == first.id


def test_it_approves_an_action(approver) -> None:
    run, _lease, cp, request = interrupted(kind="auth_required")
    body = {
        "request_id": request.id,
        "checkpoint_id": cp.id,
        "value": {"decision": "approve", "comment": "ok"},
    }
    response = post(client_for(approver), f"/api/runs/{run.pk}/resume", body, key="yes")
    assert response.status_code == 202
    assert response.json()["current_attempt"]["reason"] == "resume"
