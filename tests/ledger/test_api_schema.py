"""The ledger's operations in the OpenAPI schema: documented errors, and a schemathesis
run that finds no server error and no answer that contradicts the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
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

from ledger import services as ledger
from tests.api.conftest import client_for
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db

LEDGER_PATHS = {
    "/api/runs/{run_id}/report",
    "/api/runs/{run_id}/side-effects",
    "/api/side-effects",
    "/api/side-effects/{operation_id}",
    "/api/side-effects/{operation_id}/reconcile",
    "/api/side-effects/{operation_id}/compensate",
    "/api/worker/attempts/{attempt_id}/side-effects",
    "/api/worker/side-effects/{operation_id}/outcome",
}


@pytest.fixture
def openapi(db: None) -> dict[str, Any]:
    response = APIClient().get("/api/schema", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def test_every_ledger_operation_is_documented_with_its_problems(openapi: dict[str, Any]) -> None:
    assert openapi["paths"].keys() >= LEDGER_PATHS
    for path in LEDGER_PATHS:
        for method, operation in openapi["paths"][path].items():
            assert {"401", "403"} <= operation["responses"].keys(), (method, path)
    reconcile = openapi["paths"]["/api/side-effects/{operation_id}/reconcile"]["post"]
    (header,) = [p for p in reconcile["parameters"] if p["name"] == "Idempotency-Key"]
    assert header["required"] is True
    begin = openapi["paths"]["/api/worker/attempts/{attempt_id}/side-effects"]["post"]
    assert "409" in begin["responses"]
    assert "side_effect_unknown" in begin["responses"]["409"]["description"]


@pytest.fixture
def ids(config_dir: Path) -> dict[str, list[str]]:
    """Runs and side effects in several states, so generated requests reach real rows."""
    run = start()
    lease = claim()
    request = {"document": "app", "content": {"a": 1}}
    confirmed = ledger.side_effect_perform(
        **epochs(lease), step_id="a", tool="config_store", target="app", request=request
    ).side_effect
    pending = ledger.side_effect_begin(
        **epochs(lease), step_id="b", tool="config_store", target="app", request=request
    )
    unknown = ledger.side_effect_record_outcome(
        operation_id=ledger.side_effect_begin(
            **epochs(lease), step_id="c", tool="config_store", target="app", request=request
        ).operation_id,
        status="unknown",
    )
    return {
        "run_id": [run.pk, "run_unknown"],
        "operation_id": [
            confirmed.operation_id,
            pending.operation_id,
            unknown.operation_id,
            "op_unknown",
        ],
        "attempt_id": [lease.attempt_id, "att_unknown"],
    }


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_it_finds_no_server_error_in_the_ledger_api(
    openapi: dict[str, Any],
    ids: dict[str, list[str]],
    operator: Any,
    mode: GenerationMode,
    keep_test_connection: None,
) -> None:
    from django.core.wsgi import get_wsgi_application

    from runs.tokens import worker_token_create

    app = get_wsgi_application()
    person = client_for(operator)._credentials["HTTP_AUTHORIZATION"]
    worker = f"Bearer {worker_token_create(name='schema-worker')[1]}"
    schema = schemathesis.openapi.from_dict(openapi)
    checks = [not_a_server_error, status_code_conformance, content_type_conformance]
    if mode is GenerationMode.POSITIVE:
        checks.append(response_schema_conformance)
    operations = [
        result.ok() for result in schema.get_all_operations() if result.ok().path in LEDGER_PATHS
    ]
    assert len(operations) == len(LEDGER_PATHS)
    statuses: dict[str, set[int]] = {}
    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode), pick=st.integers(0, 3))
        @settings(
            max_examples=15,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any, pick: int) -> None:
            for name, values in ids.items():
                if name in (case.path_parameters or {}):
                    case.path_parameters[name] = values[pick % len(values)]
            token = worker if case.operation.path.startswith("/api/worker") else person
            response = case.call(app=app, headers={"Authorization": token})
            statuses.setdefault(case.operation.label, set()).add(response.status_code)
            case.validate_response(response, checks=checks)

        try:
            check()
        except Unsatisfiable:
            # GETs whose only inputs are path ids (any string is valid) cannot be made invalid.
            assert mode is GenerationMode.NEGATIVE, operation.label
    assert statuses, "no request was made"
