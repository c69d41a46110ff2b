"""The permission matrix: viewer / operator / approver / outsider / anonymous, for every endpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from runs import services
from tests.api.conftest import client_for
from tests.runs.factory import claim, epochs, interrupted, snapshot, start

pytestmark = pytest.mark.django_db

Case = tuple[str, str, dict[str, Any] | None, str | None]


def _run_get(suffix: str) -> Callable[[], Case]:
    def setup() -> Case:
        run = start()
        return "get", f"/api/runs/{run.pk}{suffix}", None, run.pk

    return setup


def _collection(url: str) -> Callable[[], Case]:
    return lambda: ("get", url, None, None)


def _start() -> Case:
    return "post", "/api/runs", {"agent": "test-agent", "input": {"n": 1}}, None


def _resume(kind: str) -> Callable[[], Case]:
    def setup() -> Case:
        value: Any = {"versions": ["v1"]} if kind == "input_required" else {"decision": "approve"}
        run, _lease, cp, request = interrupted(kind=kind)
        body = {"request_id": request.id, "checkpoint_id": cp.id, "value": value}
        return "post", f"/api/runs/{run.pk}/resume", body, run.pk

    return setup


def _cancel() -> Case:
    run = start()
    return "post", f"/api/runs/{run.pk}/cancel", {"reason": "stop"}, run.pk


def _retry() -> Case:
    run = start()
    lease = claim()
    services.attempt_fail(**epochs(lease), error={"type": "ValueError", "message": "bad"})
    return "post", f"/api/runs/{run.pk}/retry", {"reason": "fixed it"}, run.pk


ENDPOINTS: dict[str, Callable[[], Case]] = {
    "agents": _collection("/api/agents"),
    "runs": _collection("/api/runs"),
    "inbox": _collection("/api/input-requests"),
    "run": _run_get(""),
    "attempts": _run_get("/attempts"),
    "events": _run_get("/events"),
    "checkpoints": _run_get("/checkpoints"),
    "start": _start,
    "resume_input": _resume("input_required"),
    "resume_approval": _resume("auth_required"),
    "cancel": _cancel,
    "retry": _retry,
}

#                     viewer operator approver outsider anonymous
MATRIX: dict[str, tuple[int, int, int, int, int]] = {
    "agents": (200, 200, 200, 403, 401),
    "runs": (200, 200, 200, 403, 401),
    "inbox": (200, 200, 200, 403, 401),
    "run": (200, 200, 200, 404, 401),
    "attempts": (200, 200, 200, 404, 401),
    "events": (200, 200, 200, 404, 401),
    "checkpoints": (200, 200, 200, 404, 401),
    "start": (403, 201, 403, 403, 401),
    "resume_input": (403, 202, 202, 404, 401),
    "resume_approval": (403, 403, 202, 404, 401),
    "cancel": (403, 202, 403, 404, 401),
    "retry": (403, 202, 403, 404, 401),
}
PERSONAS = ("viewer", "operator", "approver", "outsider", "anonymous")
CODES = {401: "not_authenticated", 403: "permission_denied", 404: "not_found"}


@pytest.mark.parametrize("persona_index", range(len(PERSONAS)), ids=PERSONAS)
@pytest.mark.parametrize("endpoint", list(MATRIX))
def test_it_allows_exactly_the_matrix(request, endpoint: str, persona_index: int) -> None:
    persona = PERSONAS[persona_index]
    user: User | None = None if persona == "anonymous" else request.getfixturevalue(persona)
    method, url, body, run_id = ENDPOINTS[endpoint]()
    before = snapshot(run_id) if run_id else None
    client = client_for(user)
    extra = {"HTTP_IDEMPOTENCY_KEY": f"{endpoint}-{persona}"} if method == "post" else {}
    response = getattr(client, method)(url, body, format="json", **extra)
    expected = MATRIX[endpoint][persona_index]
    assert response.status_code == expected, response.content
    if expected >= 400:
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == CODES[expected]
        if run_id:
            assert snapshot(run_id) == before
    elif method == "post" and run_id:
        assert snapshot(run_id) != before


def test_it_does_not_tell_an_outsider_whether_a_run_exists(outsider) -> None:
    run = start()
    client = client_for(outsider)
    for suffix in ["", "/events", "/cancel"]:
        method = client.post if suffix == "/cancel" else client.get
        real = method(f"/api/runs/{run.pk}{suffix}", HTTP_IDEMPOTENCY_KEY="k")
        fake = method(f"/api/runs/run_01NOPENOPENOPENOPENOPENOPE{suffix}", HTTP_IDEMPOTENCY_KEY="k")
        assert real.status_code == fake.status_code == 404
        assert real.json()["detail"] == fake.json()["detail"]


def test_it_lists_nothing_but_the_question_for_an_approver_who_filters_mine(approver) -> None:
    interrupted(kind="auth_required")
    interrupted(kind="input_required")
    client = client_for(approver)
    assert len(client.get("/api/input-requests").json()["results"]) == 2
    mine = client.get("/api/input-requests?mine=true&kind=auth_required").json()["results"]
    assert [r["kind"] for r in mine] == ["auth_required"]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("delete", "/api/runs"),
        ("put", "/api/runs/{run}"),
        ("get", "/api/runs/{run}/cancel"),
        ("get", "/api/runs/{run}/resume"),
        ("post", "/api/runs/{run}/events"),
        ("get", "/api/worker/claim"),
        ("patch", "/api/input-requests"),
    ],
)
def test_it_answers_405_for_other_methods(operator, wclient, method: str, path: str) -> None:
    run = start()
    client = wclient if "/worker/" in path else client_for(operator)
    response = getattr(client, method)(path.format(run=run.pk), {}, format="json")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


def test_it_enforces_csrf_for_a_browser_session(operator) -> None:
    from rest_framework.test import APIClient

    run = start()
    browser = APIClient(enforce_csrf_checks=True)
    browser.force_login(operator)
    assert browser.get(f"/api/runs/{run.pk}").status_code == 200
    response = browser.post(
        f"/api/runs/{run.pk}/cancel", {}, format="json", HTTP_IDEMPOTENCY_KEY="k"
    )
    assert response.status_code == 403
    assert response.json()["code"] == "csrf_failed"
    browser.get("/admin/login/")  # any page that sets the CSRF cookie
    token = browser.cookies["csrftoken"].value
    response = browser.post(
        f"/api/runs/{run.pk}/cancel",
        {},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k",
        HTTP_X_CSRFTOKEN=token,
    )
    assert response.status_code == 202
