"""The pause endpoints over HTTP: permissions, Idempotency-Key replay, validation and fuzz,
the agents list with its gates, and pause_requested in the worker protocol's answers."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.test import override_settings

from runs import services
from runs.models import AgentGate, IdempotencyRecord
from tests.api.conftest import client_for, post
from tests.runs.factory import AGENT, claim, epochs, snapshot, start

pytestmark = pytest.mark.django_db


def problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == code, body
    return body


def gate_snapshot() -> list[dict[str, Any]]:
    return list(AgentGate.objects.order_by("agent").values())


# --- One run ----------------------------------------------------------------------------


def test_it_pauses_a_run_and_replays_the_answer_for_the_same_key(operator) -> None:
    run = start()
    client = client_for(operator)
    url = f"/api/runs/{run.pk}/pause"
    first = post(client, url, {"reason": "look first"}, key="p-1")
    assert first.status_code == 202
    body = first.json()
    assert body["status"] == "paused"
    assert body["pending_request"]["kind"] == "pause"
    assert body["pending_request"]["prompt"] == "look first"
    again = post(client, url, {"reason": "look first"}, key="p-1")
    assert again.status_code == 202 and again["Idempotent-Replayed"] == "true"
    assert again.json() == body
    # Another key: a clear answer, and nothing changes.
    before = snapshot(run.pk)
    second = problem(post(client, url, {"reason": "again"}, key="p-2"), 409, "invalid_state")
    assert second["already_paused"] is True and second["paused_by"] == "user:olivia"
    assert snapshot(run.pk) == before
    # The same key for another request is refused.
    problem(post(client, url, {"reason": "other"}, key="p-1"), 422, "idempotency_key_reused")


def test_continuing_replays_and_a_stale_tab_is_refused(operator) -> None:
    run = start()
    client = client_for(operator)
    post(client, f"/api/runs/{run.pk}/pause", {"reason": "x"}, key="p")
    run.refresh_from_db()
    body = {"request_id": run.pending_request_id, "checkpoint_id": None}
    url = f"/api/runs/{run.pk}/resume"
    first = post(client, url, body, key="c-1")
    assert first.status_code == 202 and first.json()["status"] == "queued"
    replay = post(client, url, body, key="c-1")
    assert replay.status_code == 202 and replay["Idempotent-Replayed"] == "true"
    problem(post(client, url, body, key="c-2"), 409, "request_mismatch")
    problem(post(client, url, {**body, "value": {"go": 1}}, key="c-3"), 409, "request_mismatch")


def test_continuing_a_pause_refuses_a_value(operator) -> None:
    run = start()
    services.run_pause(run_id=run.pk, reason="x")
    run.refresh_from_db()
    before = snapshot(run.pk)
    response = post(
        client_for(operator),
        f"/api/runs/{run.pk}/resume",
        {"request_id": run.pending_request_id, "checkpoint_id": None, "value": 1},
        key="k",
    )
    problem(response, 422, "invalid_input")
    assert snapshot(run.pk) == before


def test_only_people_who_may_cancel_may_pause_and_continue(approver, viewer, outsider) -> None:
    run = start()
    before = snapshot(run.pk)
    problem(
        post(client_for(viewer), f"/api/runs/{run.pk}/pause", {"reason": "x"}, key="k"),
        403,
        "permission_denied",
    )
    problem(
        post(client_for(approver), f"/api/runs/{run.pk}/pause", {"reason": "x"}, key="k"),
        403,
        "permission_denied",
    )
    problem(
        post(client_for(outsider), f"/api/runs/{run.pk}/pause", {"reason": "x"}, key="k"),
        404,
        "not_found",
    )
    problem(
        post(client_for(None), f"/api/runs/{run.pk}/pause", {"reason": "x"}, key="k"),
        401,
        "not_authenticated",
    )
    assert snapshot(run.pk) == before
    services.run_pause(run_id=run.pk, reason="x")
    run.refresh_from_db()
    body = {"request_id": run.pending_request_id, "checkpoint_id": None}
    # An approver answers questions but does not continue paused runs.
    problem(
        post(client_for(approver), f"/api/runs/{run.pk}/resume", body, key="k"),
        403,
        "permission_denied",
    )


@pytest.mark.parametrize(
    ("body", "code", "status"),
    [
        ({}, "invalid_input", 422),
        ({"reason": ""}, "invalid_input", 422),
        ({"reason": "x" * 2001}, "invalid_input", 422),
        ({"reason": ["x"]}, "invalid_input", 422),
        ({"reason": "x", "expires_in": 0}, "invalid_input", 422),
        ({"reason": "x", "expires_in": "soon"}, "invalid_input", 422),
        ({"reason": "x", "expires_in": 90 * 86400 + 1}, "invalid_input", 422),
        ({"reason": "x\u0000"}, "invalid_input", 422),
    ],
)
def test_it_refuses_bad_pause_bodies_and_changes_nothing(operator, body, code, status) -> None:
    run = start()
    before = snapshot(run.pk)
    response = post(client_for(operator), f"/api/runs/{run.pk}/pause", body, key="k")
    problem(response, status, code)
    assert snapshot(run.pk) == before


@pytest.mark.parametrize(
    ("raw", "content_type", "status", "code"),
    [
        (b"{not json", "application/json", 400, "malformed_request"),
        (b'"reason"', "application/json", 422, "invalid_input"),
        (b"reason=x", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
        (b'{"reason": "' + b"x" * 300_000 + b'"}', "application/json", 413, "payload_too_large"),
    ],
)
@pytest.mark.parametrize(
    "path", ["runs/{run}/pause", "agents/test-agent/pause", "agents/test-agent/unpause"]
)
def test_it_refuses_malformed_bodies_on_every_pause_endpoint(
    admin_user, raw, content_type, status, code, path
) -> None:
    run = start()
    before, gates = snapshot(run.pk), gate_snapshot()
    url = "/api/" + path.format(run=run.pk)
    response = client_for(admin_user).generic(
        "POST", url, raw, content_type=content_type, HTTP_IDEMPOTENCY_KEY="k"
    )
    problem(response, status, code)
    assert snapshot(run.pk) == before and gate_snapshot() == gates


@pytest.mark.parametrize(
    "path", ["runs/{run}/pause", "agents/test-agent/pause", "agents/test-agent/unpause"]
)
def test_every_pause_endpoint_needs_a_key(admin_user, path) -> None:
    run = start()
    url = "/api/" + path.format(run=run.pk)
    problem(post(client_for(admin_user), url, {"reason": "x"}), 400, "idempotency_key_missing")
    problem(
        post(client_for(admin_user), url, {"reason": "x"}, key="bad\tkey"),
        400,
        "idempotency_key_malformed",
    )
    assert not AgentGate.objects.filter(paused=True).exists()


@override_settings(HOLDPOINT_PAUSE_THROTTLE_PER_MINUTE=2)
def test_the_pause_endpoints_are_throttled(admin_user) -> None:
    from django.core.cache import cache

    cache.clear()
    client = client_for(admin_user)
    runs = [start() for _ in range(3)]
    answers = [
        post(client, f"/api/runs/{r.pk}/pause", {"reason": "x"}, key=f"k{i}")
        for i, r in enumerate(runs)
    ]
    assert [a.status_code for a in answers[:2]] == [202, 202]
    body = problem(answers[2], 429, "throttled")
    assert answers[2]["Retry-After"]
    assert body["status"] == 429
    runs[2].refresh_from_db()
    assert runs[2].status == "queued"
    cache.clear()


# --- The agent gate ---------------------------------------------------------------------


def test_it_pauses_and_unpauses_an_agent_with_replay(operator) -> None:
    start()
    client = client_for(operator)
    first = post(client, f"/api/agents/{AGENT}/pause", {"reason": "INC-42"}, key="a-1")
    assert first.status_code == 202, first.content
    body = first.json()
    assert body["state"] == "paused" and body["pause_reason"] == "INC-42"
    assert body["paused_by"] == "user:olivia" and body["held_runs"] == 1
    replay = post(client, f"/api/agents/{AGENT}/pause", {"reason": "INC-42"}, key="a-1")
    assert replay.status_code == 202 and replay["Idempotent-Replayed"] == "true"
    gates = gate_snapshot()
    problem(
        post(client, f"/api/agents/{AGENT}/pause", {"reason": "INC-42"}, key="a-2"),
        409,
        "invalid_state",
    )
    assert gate_snapshot() == gates
    listed = {a["name"]: a for a in client.get("/api/agents").json()}
    assert listed[AGENT]["state"] == "paused"
    assert listed[AGENT]["runs_by_status"] == {"queued": 1}
    opened = post(client, f"/api/agents/{AGENT}/unpause", {"reason": "rolled back"}, key="u-1")
    assert opened.status_code == 202 and opened.json()["state"] == "open"
    replay = post(client, f"/api/agents/{AGENT}/unpause", {"reason": "rolled back"}, key="u-1")
    assert replay["Idempotent-Replayed"] == "true"
    problem(post(client, f"/api/agents/{AGENT}/unpause", {}, key="u-2"), 409, "invalid_state")
    assert IdempotencyRecord.objects.count() >= 4


def test_the_agent_gate_needs_pause_agent_and_a_known_agent(
    approver, viewer, outsider, operator
) -> None:
    for user in (approver, viewer, outsider):
        problem(
            post(client_for(user), f"/api/agents/{AGENT}/pause", {"reason": "x"}, key="k"),
            403,
            "permission_denied",
        )
    problem(
        post(client_for(None), f"/api/agents/{AGENT}/pause", {"reason": "x"}, key="k"),
        401,
        "not_authenticated",
    )
    problem(
        post(client_for(operator), "/api/agents/nobody/pause", {"reason": "x"}, key="k"),
        404,
        "not_found",
    )
    problem(
        post(client_for(operator), "/api/agents/" + "x" * 300 + "/pause", {"reason": "x"}, key="k"),
        404,
        "not_found",
    )
    problem(
        post(client_for(operator), f"/api/agents/{AGENT}/pause", {"reason": ""}, key="k2"),
        422,
        "invalid_input",
    )
    problem(
        post(client_for(operator), f"/api/agents/{AGENT}/pause", {"reason": "x" * 2001}, key="k3"),
        422,
        "invalid_input",
    )
    problem(client_for(operator).get(f"/api/agents/{AGENT}/pause"), 405, "method_not_allowed")
    assert not AgentGate.objects.filter(paused=True).exists()


def test_the_operator_and_admin_groups_hold_pause_agent() -> None:
    for name, holds in (
        ("operator", True),
        ("admin", True),
        ("approver", False),
        ("viewer", False),
    ):
        codenames = set(Group.objects.get(name=name).permissions.values_list("codename", flat=True))
        assert ("pause_agent" in codenames) is holds, name


# --- Breakpoints and the worker protocol ------------------------------------------------


def test_a_run_started_with_breakpoints_hands_them_to_the_worker(operator, wclient) -> None:
    created = post(
        client_for(operator), "/api/runs", {"agent": AGENT, "input": {}, "pause_before": ["three"]}
    )
    assert created.status_code == 201
    problem(
        post(
            client_for(operator),
            "/api/runs",
            {"agent": AGENT, "input": {}, "pause_before": "three"},
        ),
        422,
        "invalid_input",
    )
    lease = post(wclient, "/api/worker/claim", {"worker_id": "w"}).json()
    assert lease["pause_before"] == ["three"]


def test_the_worker_protocol_says_pause_requested_and_takes_release_paused(
    operator, wclient
) -> None:
    run = start()
    lease = post(wclient, "/api/worker/claim", {"worker_id": "w", "lease_seconds": 30}).json()
    fence = {"lease_epoch": lease["lease_epoch"], "cancel_epoch": lease["cancel_epoch"]}
    base = f"/api/worker/attempts/{lease['attempt_id']}"
    beat = post(wclient, f"{base}/heartbeat", fence).json()
    assert beat["pause_requested"] is False
    post(client_for(operator), f"/api/runs/{run.pk}/pause", {"reason": "look"}, key="p")
    assert post(wclient, f"{base}/heartbeat", fence).json()["pause_requested"] is True
    saved = post(wclient, f"{base}/checkpoint", {**fence, "step": "two", "state": {}})
    assert saved.status_code == 201 and saved.json()["pause_requested"] is True
    released = post(wclient, f"{base}/release", {**fence, "reason": "paused"})
    assert released.status_code == 200, released.content
    assert released.json()["status"] == "paused"
    run.refresh_from_db()
    assert run.pending_request.checkpoint_id == saved.json()["checkpoint_id"]


def test_a_breakpoint_over_the_worker_protocol_is_an_interrupt_of_kind_pause(wclient) -> None:
    run = services.run_start(agent=AGENT, input={}, pause_before=["two"])
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="two", state={})
    response = post(
        wclient,
        f"/api/worker/attempts/{lease.attempt_id}/interrupt",
        {
            "lease_epoch": lease.lease_epoch,
            "cancel_epoch": lease.cancel_epoch,
            "checkpoint_id": cp.id,
            "kind": "pause",
            "prompt": "breakpoint before two",
            "context": {"breakpoint": "two"},
        },
    )
    assert response.status_code == 201, response.content
    assert response.json()["kind"] == "pause"
    run.refresh_from_db()
    assert run.status == "paused"
