"""Issue 13, finding 9: hostile strings get a 4xx problem with a code, never a 500.

A NUL in an id of the path (PostgreSQL text cannot hold one), ``\\u0000`` or a lone
surrogate anywhere in a JSON body, a worker id too long for the event's actor, CRLF in a
compensating action's headers. Then the fuzz: every path parameter of every route of the
API and the dashboard (walked from the URL resolver) and every string field of every JSON
endpoint (walked from the OpenAPI schema) with a table of nasty strings. Django's test
client raises what a view raises, and a 500 problem counts as a failure too.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.generators import SchemaGenerator

from ledger.models import SideEffect, ToolRule
from runs.models import RunEvent
from tests.api.conftest import client_for, worker_client
from tests.ledger.helpers import begin
from tests.runs.factory import claim, epochs, interrupted, start

pytestmark = pytest.mark.django_db

NASTY = {
    "nul": "run_\x00x",
    "lone-surrogate": "a\ud800b",
    "rtl-override": "\u202etxt.exe",
    "crlf": "a\r\nSet-Cookie: x=1",
    "10k": "x" * 10_000,
    "dot-dot": "../../etc/passwd",
    "percent": "%00%zz",
    "quote": "'\"<x>;--",
}
PROBLEM = "application/problem+json"


@dataclass
class World:
    run_id: str
    request_id: str
    attempt_id: str
    operation_id: str
    lease: Any
    tool_rule: int = 0

    def ids(self) -> dict[str, str]:
        return {
            "run_id": self.run_id,
            "request_id": self.request_id,
            "attempt_id": self.attempt_id,
            "operation_id": self.operation_id,
            "name": "test-agent",  # an agent's gate: /api/agents/{name}/pause, /agents/…
            # A tool of its MCP gateway: /api/agents/{name}/tool-rules/{server}/{tool}, …/<pk>.
            "server": "files",
            "tool": "rm",
            "pk": str(self.tool_rule),
        }


@pytest.fixture
def world(db: None) -> World:
    run, _, _, request = interrupted()
    start()
    lease = claim("w2")
    effect = begin(
        lease, reversibility="compensable", compensating_action={"url": "http://127.0.0.1:9/u"}
    )
    return World(
        run_id=run.id,
        request_id=request.id,
        attempt_id=lease.attempt_id,
        operation_id=effect.operation_id,
        lease=lease,
        tool_rule=ToolRule.objects.create(
            agent="test-agent", server="files", tool="rm", suggested="approve"
        ).pk,
    )


@pytest.fixture
def admin(db: None) -> User:
    user = User.objects.create_user(username="ada", password="pw-ada")
    user.groups.add(Group.objects.get(name="admin"))
    return user


@pytest.fixture
def clients(admin: User) -> dict[str, Any]:
    page = Client()
    page.force_login(admin)
    return {"api": client_for(admin), "worker": worker_client(), "page": page}


def principal_for(path: str, method: str = "post") -> str:
    if path.startswith("/api/worker/"):
        return "worker"
    if method == "put" and path.startswith("/api/agents/") and "/tool-rules/" not in path:
        return "worker"  # Declaring an agent (PUT /api/agents/{name}) takes a worker token.
    return "api" if path.startswith("/api/") else "page"


def assert_no_server_error(response: Any, what: str) -> None:
    assert response.status_code < 500, f"{what}: {response.status_code} {response.content[:300]!r}"
    if what.split()[1].startswith("/api/"):
        assert response["Content-Type"].startswith(PROBLEM) or response.status_code < 400, what


# --- The ones the attack found -----------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/runs/run_%00",
        "/api/runs/run_%00/events",
        "/api/side-effects/op_%00",
        "/api/runs/run_%00/side-effects",
        "/api/worker/attempts/att_%00/heartbeat",
    ],
)
def test_it_answers_a_nul_in_an_api_id_with_a_problem(path: str, clients: dict[str, Any]) -> None:
    client = clients[principal_for(path)]
    for method in ("get", "post"):
        response = getattr(client, method)(path, HTTP_IDEMPOTENCY_KEY="k-1")
        assert response.status_code == 400, response.content
        assert response["Content-Type"].startswith(PROBLEM)
        assert response.json()["code"] == "malformed_request"


@pytest.mark.parametrize(
    "path",
    [
        "/runs/run_%00/",
        "/runs/run_%00/timeline",
        "/side-effects/runs/run_%00/",
        "/side-effects/op_%00/compensate",
        "/runs/?q=%00",
    ],
)
def test_it_answers_a_nul_in_a_page_url_with_400(path: str, clients: dict[str, Any]) -> None:
    response = clients["page"].get(path)
    assert response.status_code == 400


def test_it_refuses_nul_and_lone_surrogates_in_a_json_body(
    clients: dict[str, Any], db: None
) -> None:
    api = clients["api"]
    for raw, pointer in (
        (
            '{"agent": "test-agent", "input": {"n": 1, "note": "a\\u0000b"}}',
            "/input/note",
        ),
        (
            '{"agent": "test-agent", "input": {"n": 1, "note": "a\\ud800"}}',
            "/input/note",
        ),
        (
            '{"agent": "test-agent", "input": {"n": 1, "k\\u0000": 1}}',
            "/input/k\x00",
        ),
        (
            '{"agent": "test-agent\\udfff", "input": {"n": 1}}',
            "/agent",
        ),
    ):
        response = api.post(
            "/api/runs",
            raw,
            content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
        )
        assert response.status_code == 422, response.content
        body = json.loads(response.content)
        assert body["code"] == "invalid_input"
        assert pointer in [error["pointer"] for error in body["errors"]]
    # Nothing was started.
    assert RunEvent.objects.filter(type="run.started").count() == 0


def test_it_refuses_a_worker_id_longer_than_the_actor_column_takes(
    clients: dict[str, Any], db: None
) -> None:
    start()
    worker = clients["worker"]
    response = worker.post("/api/worker/claim", {"worker_id": "w" * 194}, format="json")
    assert response.status_code == 422, response.content
    assert response.json()["errors"][0]["pointer"] == "/worker_id"
    # The longest that fits is taken, and its event names it in full.
    response = worker.post("/api/worker/claim", {"worker_id": "w" * 193}, format="json")
    assert response.status_code == 200, response.content
    assert RunEvent.objects.get(type="attempt.claimed").actor == "worker:" + "w" * 193


def test_it_refuses_crlf_in_compensating_headers_before_anything_is_recorded(
    clients: dict[str, Any], db: None
) -> None:
    # The guarded outbound client (ledger/outbound.py) checks a compensating action's
    # headers when the effect begins: a CRLF could split the request later, at undo time.
    start()
    lease = claim("w3")
    response = clients["worker"].post(
        f"/api/worker/attempts/{lease.attempt_id}/side-effects",
        {
            **{k: v for k, v in epochs(lease).items() if k != "attempt_id"},
            "step_id": "notify",
            "tool": "webhook",
            "target": "deploy-hook",
            "request": {"url": "http://127.0.0.1:9/x", "body": {}},
            "reversibility": "compensable",
            "compensating_action": {
                "url": "http://127.0.0.1:9/undo",
                "headers": {"X-Note": "a\r\nHost: internal.example"},
            },
        },
        format="json",
        HTTP_IDEMPOTENCY_KEY="begin-crlf",
    )
    assert response.status_code == 422, response.content
    assert response.json()["code"] == "invalid_input"
    assert "one line" in response.json()["detail"]
    assert not SideEffect.objects.exists()


# --- Every path parameter ---------------------------------------------------------------------


def routes() -> Iterator[tuple[str, list[str]]]:
    """``("/api/runs/<run_id>/events", ["run_id"])`` for every route with parameters,
    admin's excepted (Django's own)."""

    def walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, list[str]]]:
        for entry in patterns:
            route = str(entry.pattern)
            if isinstance(entry, URLResolver):
                if route.startswith("admin/"):
                    continue
                yield from walk(entry.url_patterns, prefix + route)
            elif isinstance(entry, URLPattern):
                full = prefix + route
                names = re.findall(r"<(?:\w+:)?(\w+)>", full)
                if names:
                    yield "/" + full, names

    yield from walk(get_resolver().url_patterns, "")


def url_for(route: str, values: dict[str, str]) -> str:
    return re.sub(
        r"<(?:\w+:)?(\w+)>",
        lambda match: quote(values[match.group(1)], safe="", errors="surrogatepass"),
        route,
    )


def test_it_walks_the_routes_of_the_api_and_the_dashboard() -> None:
    found = {route for route, _ in routes()}
    assert "/api/runs/<str:run_id>" in found
    assert "/api/worker/side-effects/<str:operation_id>/outcome" in found
    assert "/runs/<str:run_id>/requests/<str:request_id>/answer" in found
    assert "/side-effects/<str:operation_id>/compensate" in found


def test_no_path_parameter_gives_a_server_error(world: World, clients: dict[str, Any]) -> None:
    tried = 0
    for route, names in routes():
        client = clients[principal_for(route)]
        for name, (label, nasty) in itertools.product(names, NASTY.items()):
            url = url_for(route, {**world.ids(), name: nasty})
            for method in ("get", "post"):
                extra = {"HTTP_IDEMPOTENCY_KEY": str(uuid.uuid4())}
                response = getattr(client, method)(url, **extra)
                assert_no_server_error(response, f"{method.upper()} {url[:80]} ({name}={label})")
                tried += 1
    assert tried > 100


# --- Every string field of every JSON endpoint ---------------------------------------------------


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    if "allOf" in node and len(node["allOf"]) == 1:
        return _resolve(schema, node["allOf"][0])
    return node


def baseline(schema: dict[str, Any], node: dict[str, Any], depth: int = 0) -> Any:
    """A plausible value for ``node``: enough to get past shape checks into the service."""
    node = _resolve(schema, node)
    if "enum" in node:
        return next((v for v in node["enum"] if v is not None), None)
    kind = node.get("type")
    if kind == "object" or "properties" in node:
        props = node.get("properties", {})
        return {
            name: baseline(schema, sub, depth + 1)
            for name, sub in props.items()
            if depth < 4 and not _resolve(schema, sub).get("readOnly")
        }
    if kind == "array":
        return [baseline(schema, node.get("items", {}), depth + 1)] if depth < 4 else []
    if kind == "integer":
        return int(node.get("minimum", 0))
    if kind == "number":
        return float(node.get("minimum", 1))
    if kind == "boolean":
        return False
    if kind == "string":
        return "x"
    return {"n": 1}  # A JSON value of any kind (input, state, answer, request).


def string_fields(
    schema: dict[str, Any], node: dict[str, Any], pointer: tuple[Any, ...] = ()
) -> Iterator[tuple[tuple[Any, ...], str]]:
    """``(pointer, "string"|"any")`` of every string and any-JSON field under ``node``."""
    node = _resolve(schema, node)
    if len(pointer) > 4 or "enum" in node:
        if "enum" in node:
            yield pointer, "string"
        return
    kind = node.get("type")
    if kind == "object" or "properties" in node:
        for name, sub in node.get("properties", {}).items():
            if not _resolve(schema, sub).get("readOnly"):
                yield from string_fields(schema, sub, (*pointer, name))
    elif kind == "array":
        yield from string_fields(schema, node.get("items", {}), (*pointer, 0))
    elif kind == "string":
        yield pointer, "string"
    elif kind is None:
        yield pointer, "any"


def with_value(body: Any, pointer: tuple[Any, ...], value: Any) -> Any:
    body = json.loads(json.dumps(body))
    target = body
    for step in pointer[:-1]:
        target = target[step]
    target[pointer[-1]] = value
    return body


def json_operations() -> Iterator[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                yield path, method, content["application/json"]["schema"], schema


def test_no_string_in_a_json_body_gives_a_server_error(
    world: World, clients: dict[str, Any]
) -> None:
    tried = 0
    operations = list(json_operations())
    assert len(operations) >= 10
    for path, method, body_schema, schema in operations:
        url = re.sub(r"\{(\w+)\}", lambda m: world.ids()[m.group(1)], path)
        client = clients[principal_for(url, method)]
        good = baseline(schema, body_schema)
        if url.startswith("/api/worker/"):
            good.update(
                {k: v for k, v in epochs(world.lease).items() if k in good and k != "attempt_id"}
            )
        for pointer, kind in string_fields(schema, body_schema):
            for label, nasty in NASTY.items():
                values = [nasty] if kind == "string" else [nasty, {nasty: 1}, {"k": [nasty]}]
                for value in values:
                    body = with_value(good, pointer, value)
                    response = getattr(client, method)(
                        url,
                        json.dumps(body),
                        content_type="application/json",
                        HTTP_IDEMPOTENCY_KEY=str(uuid.uuid4()),
                    )
                    where = "/".join(map(str, pointer))
                    assert_no_server_error(response, f"{method.upper()} {url} /{where}={label}")
                    tried += 1
    assert tried > 200
    assert SideEffect.objects.exists()
