"""The OpenAPI schema: valid, complete about errors and keys, and a schemathesis run on it."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from drf_spectacular.validation import validate_schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from rest_framework.test import APIClient
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from ledger.models import ToolRule
from runs import services
from tests.api.conftest import client_for
from tests.runs.factory import claim, epochs, interrupted, start

pytestmark = pytest.mark.django_db

CONTROL_POSTS = [
    "/api/runs/{run_id}/resume",
    "/api/runs/{run_id}/cancel",
    "/api/runs/{run_id}/retry",
]


@pytest.fixture
def openapi(db: None) -> dict[str, Any]:
    response = APIClient().get("/api/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def test_it_serves_a_valid_openapi_3_schema(openapi: dict[str, Any]) -> None:
    assert openapi["openapi"].startswith("3.")
    validate_schema(openapi)
    paths = openapi["paths"]
    for path in ["/api/runs", "/api/runs/{run_id}/events", "/api/input-requests", "/api/agents"]:
        assert path in paths
    assert "/api/worker/attempts/{attempt_id}/complete" in paths


def test_it_documents_the_idempotency_key(openapi: dict[str, Any]) -> None:
    for path in CONTROL_POSTS:
        operation = openapi["paths"][path]["post"]
        (header,) = [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
        assert header["in"] == "header" and header["required"] is True
        assert {"400", "409", "422"} <= operation["responses"].keys()
    start_op = openapi["paths"]["/api/runs"]["post"]
    (header,) = [p for p in start_op["parameters"] if p["name"] == "Idempotency-Key"]
    assert not header.get("required", False)


def test_it_documents_every_error_as_a_problem(openapi: dict[str, Any]) -> None:
    for path, item in openapi["paths"].items():
        if path == "/api/schema":
            continue
        for method, operation in item.items():
            responses = operation["responses"]
            assert "401" in responses and "403" in responses, (method, path)
            if method == "post":
                assert {"400", "413", "415", "422"} <= responses.keys(), (method, path)
            for status, response in responses.items():
                if int(status) >= 400:
                    assert list(response["content"]) == ["application/problem+json"]
                    assert response["content"]["application/problem+json"]["schema"] == {
                        "$ref": "#/components/schemas/Problem"
                    }


@pytest.fixture
def wsgi_app(keep_test_connection: None) -> Any:
    return get_wsgi_application()


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_it_finds_no_server_error_in_the_control_api(
    openapi: dict[str, Any], wsgi_app: Any, admin_user, mode: GenerationMode
) -> None:
    # Runs in every state, so that generated requests reach real runs and not only 404s.
    queued = start()
    waiting_input = interrupted()[0]
    approval = interrupted(kind="auth_required")[0]
    failed = start()
    services.attempt_fail(**epochs(claim()), error={"type": "ValueError", "message": "bad"})
    run_ids = [queued.pk, waiting_input.pk, approval.pk, failed.pk, "run_unknown"]
    token = client_for(admin_user)._credentials["HTTP_AUTHORIZATION"]

    schema = schemathesis.openapi.from_dict(openapi)
    checks = [not_a_server_error, status_code_conformance, content_type_conformance]
    if mode is GenerationMode.POSITIVE:
        checks.append(response_schema_conformance)
    operations = [
        result.ok()
        for result in schema.get_all_operations()
        if not result.ok().path.startswith(("/api/worker", "/api/schema"))
        # Declaring an agent is a worker's operation (tests/api/test_worker_protocol.py).
        and result.ok().label != "PUT /api/agents/{name}"
    ]
    # The control API of runs (11, and 3 to pause a run or an agent), of the ledger (6), the
    # audit trail (1), the MCP gateway's tool rules (3) and the operations page's stats (1).
    assert len(operations) == 25
    # A tool of the test agent's gateway, so that rule confirmations reach a real row.
    ToolRule.objects.create(agent="test-agent", server="files", tool="rm", suggested="approve")
    skipped = []
    statuses: dict[str, set[int]] = {}
    for operation in operations:

        @given(
            case=operation.as_strategy(generation_mode=mode),
            run_id=st.sampled_from(run_ids),
            known_agent=st.booleans(),
        )
        @settings(
            max_examples=15,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any, run_id: str, known_agent: bool) -> None:
            # Aim some requests at real runs and a real agent, so they get past the 404/422.
            if "run_id" in (case.path_parameters or {}):
                case.path_parameters["run_id"] = run_id
            if known_agent and "name" in (case.path_parameters or {}):
                case.path_parameters["name"] = "test-agent"
            if known_agent and "server" in (case.path_parameters or {}):
                case.path_parameters.update(server="files", tool="rm")
            if known_agent and isinstance(case.body, dict) and "agent" in case.body:
                case.body["agent"] = "test-agent"
            response = case.call(app=wsgi_app, headers={"Authorization": token})
            statuses.setdefault(case.operation.label, set()).add(response.status_code)
            case.validate_response(response, checks=checks)

        try:
            check()
        except Unsatisfiable:
            assert mode is GenerationMode.NEGATIVE, operation.label
            skipped.append(operation.label)
    # The run reached past the gates: some generated writes were carried out (positive), or
    # refused by the views' own checks rather than by authentication (negative: every
    # request is invalid on purpose).
    posts = set().union(*(v for k, v in statuses.items() if k.startswith("POST")))
    if mode is GenerationMode.POSITIVE:
        assert posts & {201, 202}, statuses
    else:
        assert posts & {400, 409, 422}, statuses
    # These take no input that can be made invalid (a path id is any string).
    assert skipped in (
        [],
        [
            "GET /api/agents",
            "GET /api/agents/{name}/tool-rules",
            "GET /api/runs/{run_id}",
            "GET /api/runs/{run_id}/attempts",
            "GET /api/runs/{run_id}/checkpoints",
            "GET /api/runs/{run_id}/report",
            "GET /api/runs/{run_id}/side-effects",
            "GET /api/side-effects/{operation_id}",
        ],
    )


def _api_routes() -> list[tuple[str, str]]:
    """Every (path, method) the API's URLconf serves, with OpenAPI's path syntax."""
    import re

    from django.urls import URLPattern

    from api import urls

    routes = []
    for pattern in urls.urlpatterns:
        assert isinstance(pattern, URLPattern)
        view_class = getattr(pattern.callback, "view_class", None)
        if view_class is None or "schema" in str(pattern.pattern):
            continue
        path = "/api/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(pattern.pattern))
        for method in ("get", "post", "put", "patch", "delete"):
            if hasattr(view_class, method):
                routes.append((path, method))
    return routes


def test_it_documents_every_route_of_the_api_and_its_worker_protocol(
    openapi: dict[str, Any],
) -> None:
    routes = _api_routes()
    assert sum(path.startswith("/api/worker/") for path, _ in routes) >= 10
    for path, method in routes:
        operation = openapi["paths"].get(path, {}).get(method)
        assert operation is not None, f"{method.upper()} {path} is not in the schema"
        responses = operation["responses"]
        assert any(code.startswith("2") for code in responses), f"{method} {path}: no 2xx"
        problems = [code for code in responses if code.startswith(("4", "5"))]
        assert problems, f"{method.upper()} {path} documents no error"
        if method in ("post", "put"):
            assert "requestBody" in operation, f"{method.upper()} {path} documents no body"
