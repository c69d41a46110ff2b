"""Every error is application/problem+json with type, title, status, detail and our code."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import time_machine
from django.test import Client, override_settings
from rest_framework import exceptions

from api.problems import exception_handler, problem_response
from runs import services
from runs.errors import ERROR_STATUS, HoldpointError
from runs.models import IdempotencyRecord, Run
from runs.schemas import MAX_JSON_DEPTH
from runs.schemas import too_deep as json_too_deep
from runs.services.control import _retry_guards, register_retry_guard
from tests.api.conftest import client_for, post
from tests.runs.factory import claim, epochs, interrupted, snapshot, start

pytestmark = pytest.mark.django_db

PROBLEM = "application/problem+json"


def assert_problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body = json.loads(response.content)
    assert body["type"] == f"urn:holdpoint:problem:{code}"
    assert body["status"] == status
    assert body["code"] == code
    assert body["title"] and body["detail"]
    return body


@pytest.mark.parametrize("code", sorted(ERROR_STATUS))
def test_it_renders_every_code_as_a_problem(code: str) -> None:
    assert_problem(problem_response(code, "why"), ERROR_STATUS[code], code)
    response = exception_handler(HoldpointError(code, "why", fact=1), {"request": None})
    assert response is not None
    assert response.status_code == ERROR_STATUS[code]
    assert response.content_type == PROBLEM
    assert response.data["code"] == code and response.data["fact"] == 1


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (exceptions.ParseError("bad"), 400, "malformed_request"),
        (exceptions.NotAuthenticated(), 401, "not_authenticated"),
        (exceptions.AuthenticationFailed(), 401, "authentication_failed"),
        (exceptions.PermissionDenied(), 403, "permission_denied"),
        (exceptions.NotFound(), 404, "not_found"),
        (exceptions.MethodNotAllowed("PUT"), 405, "method_not_allowed"),
        (exceptions.NotAcceptable(), 406, "not_acceptable"),
        (exceptions.UnsupportedMediaType("text/plain"), 415, "unsupported_media_type"),
        (exceptions.Throttled(wait=7), 429, "throttled"),
    ],
)
def test_it_maps_drf_errors_to_codes(exc, status: int, code: str) -> None:
    response = exception_handler(exc, {"request": None})
    assert response is not None
    assert (response.status_code, response.data["code"]) == (status, code)
    if code == "throttled":
        assert response["Retry-After"] == "7"


def test_it_answers_an_unknown_api_path_with_a_problem(operator) -> None:
    response = client_for(operator).get("/api/nothing-here")
    assert_problem(response, 404, "not_found")
    # Answered at once: no HTML page rendered and thrown away (handler404).
    assert not response.templates
    # Elsewhere a person gets the dashboard's page.
    page = Client().get("/nothing-here/")
    assert page.status_code == 404
    assert "404.html" in [t.name for t in page.templates]
    assert page["Content-Type"].startswith("text/html")


@pytest.mark.parametrize("host", ["", "evil.example.com", "bad host"])
def test_it_answers_a_bad_host_header_with_a_problem(operator, host: str) -> None:
    # Django refuses these itself (DisallowedHost) before any view, in HTML unless told.
    body = {"agent": "test-agent", "input": {}}
    response = post(client_for(operator), "/api/runs", body, key="host", HTTP_HOST=host)
    assert_problem(response, 400, "malformed_request")
    assert not Run.objects.exists() and not IdempotencyRecord.objects.exists()


def test_it_refuses_malformed_json(operator) -> None:
    response = client_for(operator).post("/api/runs", "{nope", content_type="application/json")
    assert_problem(response, 400, "malformed_request")


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5000, 100_000])
def test_it_refuses_deep_json_before_any_work(operator, depth: int) -> None:
    body = '{"agent": "test-agent", "input": ' + "[" * depth + "]" * depth + "}"
    response = client_for(operator).post(
        "/api/runs", body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="deep"
    )
    assert_problem(response, 400, "malformed_request")
    assert not Run.objects.exists() and not IdempotencyRecord.objects.exists()


def test_it_accepts_json_as_deep_as_the_limit(operator) -> None:
    nested: list = []
    for _ in range(MAX_JSON_DEPTH - 2):
        nested = [nested]
    response = post(client_for(operator), "/api/runs", {"agent": "test-agent", "input": nested})
    # Deep enough to pass the gate, then refused by the agent's schema, not the gate.
    assert_problem(response, 422, "invalid_input")
    assert not json_too_deep({"input": nested})


@override_settings(HOLDPOINT_MAX_BODY_BYTES=1024)
def test_it_refuses_an_oversized_body_before_any_work(operator) -> None:
    body = {"agent": "test-agent", "input": {"pad": "x" * 2000}}
    response = post(client_for(operator), "/api/runs", body, key="big")
    problem = assert_problem(response, 413, "payload_too_large")
    assert problem["limit"] == 1024
    assert not Run.objects.exists() and not IdempotencyRecord.objects.exists()


def test_it_refuses_other_media_types(operator) -> None:
    response = client_for(operator).post(
        "/api/runs", "agent=x", content_type="application/x-www-form-urlencoded"
    )
    assert_problem(response, 415, "unsupported_media_type")


def test_it_refuses_an_unacceptable_accept_header(operator) -> None:
    response = client_for(operator).get("/api/runs", HTTP_ACCEPT="text/csv")
    assert_problem(response, 406, "not_acceptable")


def test_it_lists_failing_fields_as_pointers(operator) -> None:
    response = post(client_for(operator), "/api/runs", {"input": {}, "approvals": [1, ""]})
    problem = assert_problem(response, 422, "invalid_input")
    assert {e["pointer"] for e in problem["errors"]} == {"/agent", "/approvals/1"}


def test_it_points_schema_errors_into_the_body(operator) -> None:
    response = post(client_for(operator), "/api/runs", {"agent": "test-agent", "input": {"n": "x"}})
    problem = assert_problem(response, 422, "invalid_input")
    assert problem["errors"] == [{"pointer": "/input/n", "message": "'x' is not of type 'integer'"}]
    run, _lease, cp, request = interrupted()
    body = {"request_id": request.id, "checkpoint_id": cp.id, "value": {"versions": [1]}}
    response = post(client_for(operator), f"/api/runs/{run.pk}/resume", body, key="r")
    problem = assert_problem(response, 422, "invalid_input")
    assert [e["pointer"] for e in problem["errors"]] == ["/value/versions/0"]


def test_it_refuses_an_unknown_agent(operator) -> None:
    response = post(client_for(operator), "/api/runs", {"agent": "nope", "input": {}})
    assert assert_problem(response, 422, "unknown_agent")["agent"] == "nope"


def test_it_names_a_stale_checkpoint(operator) -> None:
    run, _lease, _cp, request = interrupted()
    before = snapshot(run.pk)
    body = {"request_id": request.id, "checkpoint_id": "cp_other", "value": {"versions": []}}
    response = post(client_for(operator), f"/api/runs/{run.pk}/resume", body, key="k")
    assert assert_problem(response, 409, "stale_checkpoint")["latest_checkpoint_id"] == _cp.id
    assert snapshot(run.pk) == before


def test_it_names_a_request_of_another_run(operator) -> None:
    run = interrupted()[0]
    _other, _lease, cp2, request2 = interrupted()
    body = {"request_id": request2.id, "checkpoint_id": cp2.id, "value": {"versions": []}}
    response = post(client_for(operator), f"/api/runs/{run.pk}/resume", body, key="k")
    assert_problem(response, 409, "request_mismatch")


def test_it_refuses_an_expired_request(operator) -> None:
    run, _lease, cp, request = interrupted(expires_in=60)
    body = {"request_id": request.id, "checkpoint_id": cp.id, "value": {"versions": []}}
    with time_machine.travel(dt.timedelta(seconds=120)):
        response = post(client_for(operator), f"/api/runs/{run.pk}/resume", body, key="k")
    assert_problem(response, 409, "request_expired")


def test_it_says_why_a_retry_is_not_allowed(operator) -> None:
    run = start()
    lease = claim()
    services.attempt_fail(**epochs(lease), error={"type": "ValueError", "message": "bad"})

    def unsettled(run: Run) -> str | None:
        return "A side effect is still unknown."

    register_retry_guard(unsettled)
    try:
        response = post(client_for(operator), f"/api/runs/{run.pk}/retry", {"reason": "x"}, key="k")
    finally:
        _retry_guards.remove(unsettled)
    problem = assert_problem(response, 409, "retry_not_allowed")
    assert problem["reasons"] == ["A side effect is still unknown."]


def test_it_refuses_a_retry_from_a_checkpoint_of_another_run(operator) -> None:
    run = start()
    lease = claim()
    services.attempt_fail(**epochs(lease), error={"type": "ValueError", "message": "bad"})
    body = {"reason": "x", "from_checkpoint": "cp_elsewhere"}
    response = post(client_for(operator), f"/api/runs/{run.pk}/retry", body, key="k")
    problem = assert_problem(response, 422, "invalid_input")
    assert problem["errors"][0]["pointer"] == "/from_checkpoint"


def test_it_refuses_a_bad_token(db) -> None:
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token nope")
    response = client.get("/api/runs")
    assert_problem(response, 401, "authentication_failed")
    assert response["WWW-Authenticate"] == "Token"
