"""The worker API: an agent driven purely over HTTP, the fence, and worker tokens."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from runs import services
from runs.models import Attempt, Run, RunEvent
from runs.tokens import worker_token_revoke
from tests.api.conftest import client_for, post, worker_client
from tests.runs.factory import snapshot, start

pytestmark = pytest.mark.django_db


def fenced(lease: dict[str, Any], **body: Any) -> dict[str, Any]:
    return {"lease_epoch": lease["lease_epoch"], "cancel_epoch": lease["cancel_epoch"], **body}


def url(lease: dict[str, Any], action: str) -> str:
    return f"/api/worker/attempts/{lease['attempt_id']}/{action}"


def claim(worker: APIClient, worker_id: str = "go-worker-1", **body: Any) -> dict[str, Any]:
    response = post(worker, "/api/worker/claim", {"worker_id": worker_id, **body})
    assert response.status_code == 200, response.content
    return response.json()


def test_it_drives_a_run_over_http_through_a_hold_point(operator, wclient) -> None:
    person = client_for(operator)
    started = post(person, "/api/runs", {"agent": "test-agent", "input": {"n": 2}}, key="s1")
    assert started.status_code == 201
    run_id = started.json()["run_id"]

    lease = claim(wclient, lease_seconds=30)
    assert (lease["run_id"], lease["number"], lease["reason"]) == (run_id, 1, "initial")
    assert lease["input"] == {"n": 2}
    assert (lease["lease_epoch"], lease["cancel_epoch"]) == (1, 0)
    assert lease["heartbeat_seconds"] == 10
    assert lease["resume_from"] is None and lease["resume_request"] is None

    beat = post(wclient, url(lease, "heartbeat"), {"lease_epoch": 1, "lease_seconds": 30})
    assert beat.status_code == 200
    assert beat.json()["cancel_requested"] is False
    assert beat.json()["lease_expires_at"].endswith("Z")

    saved = post(wclient, url(lease, "checkpoint"), fenced(lease, step="choose", state={"k": 1}))
    assert saved.status_code == 201
    checkpoint_id = saved.json()["checkpoint_id"]
    asked = post(
        wclient,
        url(lease, "interrupt"),
        fenced(
            lease,
            checkpoint_id=checkpoint_id,
            kind="input_required",
            prompt="Which versions stay compatible?",
            accepted_schema={"versions": "string[]"},
            expires_in=3600,
            step_id="choose",
        ),
    )
    assert asked.status_code == 201
    request = asked.json()
    assert request["accepted_schema"]["required"] == ["versions"]

    # A person finds the question in the inbox and answers it over the control API.
    inbox = person.get("/api/input-requests").json()["results"]
    assert [r["request_id"] for r in inbox] == [request["request_id"]]
    answer = {"request_id": request["request_id"], "checkpoint_id": checkpoint_id}
    resumed = post(
        person, f"/api/runs/{run_id}/resume", {**answer, "value": {"versions": ["v2"]}}, key="a1"
    )
    assert resumed.status_code == 202
    assert resumed.json()["status"] == "queued"

    second = claim(wclient)
    assert (second["number"], second["reason"], second["lease_epoch"]) == (2, "resume", 2)
    assert second["resume_from"] == {
        "checkpoint_id": checkpoint_id,
        "step": "choose",
        "state": {"k": 1},
        "number": 1,
    }
    assert second["resume_request"] == {
        "request_id": request["request_id"],
        "kind": "input_required",
        "step_id": "choose",
        "answer": {"versions": ["v2"]},
        "answered_by": "olivia",
        "action": None,
    }
    done = post(wclient, url(second, "complete"), fenced(second, result={"ok": True}, cost=0.25))
    assert done.status_code == 200
    assert done.json()["status"] == "succeeded"

    run = person.get(f"/api/runs/{run_id}").json()
    assert (run["status"], run["result"], run["cost"]) == ("succeeded", {"ok": True}, "0.250000")
    types = [e["type"] for e in person.get(f"/api/runs/{run_id}/events").json()]
    assert types == [
        "run.created",
        "attempt.claimed",
        "checkpoint.saved",
        "run.interrupted",
        "request.answered",
        "run.resumed",
        "attempt.claimed",
        "run.succeeded",
    ]


def test_it_answers_204_when_no_attempt_is_due(wclient) -> None:
    assert post(wclient, "/api/worker/claim", {"worker_id": "w"}).status_code == 204
    start()
    response = post(wclient, "/api/worker/claim", {"worker_id": "w", "agents": ["other"]})
    assert response.status_code == 204


def test_it_fences_a_worker_whose_lease_was_given_to_another(wclient) -> None:
    run = start()
    old = claim(wclient, "w-old")
    # The old worker stalls; its lease runs out (moved in the database: the DB clock decides).
    Attempt.objects.filter(pk=old["attempt_id"]).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    services.leases_expire()
    new = claim(worker_client("other"), "w-new")
    assert new["lease_epoch"] == old["lease_epoch"] + 1
    before = snapshot(run.pk)
    for action, body in [
        ("checkpoint", fenced(old, step="x", state={})),
        ("complete", fenced(old, result={})),
        ("fail", fenced(old, error={"type": "E", "message": "m"})),
        ("heartbeat", {"lease_epoch": old["lease_epoch"]}),
        ("release", {"lease_epoch": old["lease_epoch"], "reason": "shutdown"}),
    ]:
        response = post(wclient, url(old, action), body)
        assert response.status_code == 409, action
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "stale_worker", action
    assert snapshot(run.pk) == before


def test_it_fences_writes_after_a_cancel_and_lets_the_worker_acknowledge(operator, wclient) -> None:
    run = start()
    lease = claim(wclient)
    checkpoint_id = post(
        wclient, url(lease, "checkpoint"), fenced(lease, step="a", state={})
    ).json()["checkpoint_id"]
    cancelled = post(client_for(operator), f"/api/runs/{run.pk}/cancel", {"reason": "no"}, key="c")
    assert cancelled.status_code == 202
    assert cancelled.json()["status"] == "cancel_requested"
    before = snapshot(run.pk)
    for action, body in [
        ("checkpoint", fenced(lease, step="b", state={})),
        ("complete", fenced(lease, result={"late": True})),
        ("fail", fenced(lease, error={"type": "E"})),
        (
            "interrupt",
            fenced(
                lease,
                checkpoint_id=checkpoint_id,
                kind="input_required",
                prompt="?",
                accepted_schema={"a": "string"},
            ),
        ),
    ]:
        response = post(wclient, url(lease, action), body)
        assert response.status_code == 409, action
        problem = response.json()
        assert problem["code"] == "stale_after_cancel", action
        assert problem["run_cancel_epoch"] == 1 and problem["given_cancel_epoch"] == 0
    assert snapshot(run.pk) == before
    # Heartbeats are fenced by lease only: the worker learns of the cancel and acknowledges.
    beat = post(wclient, url(lease, "heartbeat"), {"lease_epoch": lease["lease_epoch"]})
    assert beat.json()["cancel_requested"] is True
    released = post(
        wclient, url(lease, "release"), {"lease_epoch": lease["lease_epoch"], "reason": "cancelled"}
    )
    assert released.status_code == 200
    assert released.json()["status"] == "cancelled"
    assert Attempt.objects.get(pk=lease["attempt_id"]).status == "aborted"


def test_it_hands_a_shut_down_attempt_to_the_next_worker(wclient) -> None:
    run = start()
    lease = claim(wclient)
    post(wclient, url(lease, "checkpoint"), fenced(lease, step="b", state={"x": 1}))
    released = post(
        wclient, url(lease, "release"), {"lease_epoch": lease["lease_epoch"], "reason": "shutdown"}
    )
    assert released.json()["status"] == "queued"
    nxt = claim(wclient, "w2")
    # A hand-over, not a lost lease (issue 25, point 3).
    assert (nxt["run_id"], nxt["reason"], nxt["resume_from"]["step"]) == (run.pk, "released", "b")


def test_it_classifies_failures_reported_over_http(operator, wclient) -> None:
    run = start()
    lease = claim(wclient)
    response = post(
        wclient,
        url(lease, "fail"),
        fenced(lease, error={"class": "deterministic", "type": "KeyError", "message": "no key 7"}),
    )
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["failure_class"]) == (
        "failed",
        "deterministic",
    )
    attempts = client_for(operator).get(f"/api/runs/{run.pk}/attempts").json()
    error = attempts[0]["error"]
    assert (error["class"], error["type"], error["message"]) == (
        "deterministic",
        "KeyError",
        "no key 7",
    )
    assert len(error["fingerprint"]) == 16


def test_it_backs_off_a_transient_failure(wclient) -> None:
    start()
    lease = claim(wclient)
    response = post(wclient, url(lease, "fail"), fenced(lease, error={"type": "Timeout"}))
    assert response.json()["status"] == "waiting"


def test_it_points_at_the_failing_fields(wclient) -> None:
    start()
    lease = claim(wclient)
    response = post(wclient, url(lease, "fail"), {"cancel_epoch": "x", "error": {"message": 1}})
    assert response.status_code == 422
    pointers = {e["pointer"] for e in response.json()["errors"]}
    assert pointers == {"/lease_epoch", "/cancel_epoch", "/error/type"}
    response = post(wclient, url(lease, "fail"), fenced(lease, error={"class": "odd"}))
    assert {e["pointer"] for e in response.json()["errors"]} == {"/error/class", "/error/type"}
    response = post(
        wclient,
        url(lease, "interrupt"),
        fenced(lease, checkpoint_id="cp_x", kind="input_required", prompt="?", accepted_schema=[]),
    )
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_input"


def test_it_answers_404_for_an_unknown_attempt(wclient) -> None:
    response = post(
        wclient,
        "/api/worker/attempts/att_nope/complete",
        {"lease_epoch": 1, "cancel_epoch": 0, "result": {}},
    )
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_it_accepts_only_worker_tokens_on_the_worker_api(operator, admin_user) -> None:
    anonymous = post(APIClient(), "/api/worker/claim", {"worker_id": "w"})
    assert anonymous.status_code == 401
    assert anonymous["WWW-Authenticate"].startswith("Bearer")
    assert anonymous.json()["code"] == "not_authenticated"
    person = post(client_for(admin_user), "/api/worker/claim", {"worker_id": "w"})
    assert person.status_code == 401
    session = APIClient()
    session.force_login(admin_user)
    assert post(session, "/api/worker/claim", {"worker_id": "w"}).status_code == 401
    bogus = APIClient()
    bogus.credentials(HTTP_AUTHORIZATION="Bearer hpw_not-a-token")
    response = post(bogus, "/api/worker/claim", {"worker_id": "w"})
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"


def test_it_refuses_a_revoked_token_and_keeps_workers_off_the_control_api() -> None:
    worker = worker_client("gone")
    assert post(worker, "/api/worker/claim", {"worker_id": "w"}).status_code == 204
    assert worker.get("/api/runs").status_code == 401
    assert worker_token_revoke(name="gone") == 1
    response = post(worker, "/api/worker/claim", {"worker_id": "w"})
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"


def test_it_replays_a_lost_complete_instead_of_calling_it_stale(wclient) -> None:
    run = start()
    lease = claim(wclient)
    body = fenced(lease, result={"n": 1})
    first = post(wclient, url(lease, "complete"), body, key="done-1")
    again = post(wclient, url(lease, "complete"), body, key="done-1")
    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert RunEvent.objects.filter(run=run, type="run.succeeded").count() == 1
    assert Run.objects.get(pk=run.pk).status == "succeeded"
