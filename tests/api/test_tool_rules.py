"""The MCP gateway's tool rules over HTTP: the gateway's report and read (its worker token,
only for the agent it serves), people's read, confirm and confirm-suggested (the
permission, the Idempotency-Key, the throttle), problems with stable codes, the audit
trail, and random bodies that never break anything."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import uuid
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import User
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from ledger.models import ToolRule
from runs import services
from runs.audit_log import AuditFilter, agent_audit_events
from runs.models import AgentEvent
from runs.tokens import serving_for, worker_token_create
from tests.api.conftest import client_for
from tests.api.test_pause import problem
from tests.runs.factory import start

pytestmark = pytest.mark.django_db

AGENT = "gw-agent"
TOOLS_URL = f"/api/worker/agents/{AGENT}/mcp-tools"
RULES_URL = f"/api/agents/{AGENT}/tool-rules"


def gateway_client(token: str = "gateway", agent: str = AGENT) -> APIClient:
    """The worker token of a gateway that declared ``agent``."""
    made, secret = worker_token_create(name=token)
    services.agent_declare(name=agent, actor=f"worker:{token}", serving=serving_for(made))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def tool(name: str, server: str = "files", **annotations: Any) -> dict[str, Any]:
    return {
        "server": server,
        "name": name,
        "description": f"The {name} tool.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        "annotations": annotations,
    }


TOOLS = [
    tool("read_file", readOnlyHint=True),
    tool("append_log", destructiveHint=False),
    tool("delete_file", destructiveHint=True, title="Delete"),
    tool("ns/odd.name"),
]


def report(client: APIClient, tools: list[dict[str, Any]] = TOOLS) -> dict[str, Any]:
    response = client.put(TOOLS_URL, {"tools": tools}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def state() -> list[Any]:
    return [
        *ToolRule.objects.order_by("id").values_list(
            "agent", "server", "tool", "rule", "patterns", "reported_hash", "offered"
        ),
        *AgentEvent.objects.order_by("id").values_list("type", "payload"),
    ]


def confirm(client: APIClient, path: str, body: Any, key: str | None = "k1", **extra: Any) -> Any:
    if key is not None:
        extra["HTTP_IDEMPOTENCY_KEY"] = key
    return client.put(f"{RULES_URL}/{path}", body, format="json", **extra)


@pytest.fixture
def gw(db: None) -> APIClient:
    client = gateway_client()
    report(client)
    return client


# --- The gateway ----------------------------------------------------------------------------


def test_the_gateway_reports_and_reads_the_rules_in_force(db: None) -> None:
    client = gateway_client()
    answer = report(client)
    by_name = {rule["name"]: rule for rule in answer["rules"]}
    assert set(by_name) == {"read_file", "append_log", "delete_file", "ns/odd.name"}
    # Unconfirmed: approve and no patterns, whatever the annotations suggest.
    assert {(r["rule"], r["confirmed"], tuple(r["patterns"])) for r in answer["rules"]} == {
        ("approve", False, ())
    }
    assert by_name["read_file"]["suggested"] == "pass"
    assert by_name["append_log"]["suggested"] == "record"
    assert by_name["delete_file"]["suggested"] == "approve"
    assert set(by_name["read_file"]) == {
        "server",
        "name",
        "rule",
        "patterns",
        "confirmed",
        "suggested",
        "input_schema",
    }
    assert by_name["read_file"]["input_schema"] == TOOLS[0]["input_schema"]
    read = client.get(TOOLS_URL)
    assert read.status_code == 200
    assert read.json() == answer


def test_a_confirmed_rule_reaches_the_gateway_and_survives_its_next_report(
    gw: APIClient, admin_user: User
) -> None:
    pattern = {"argument": "path", "matches": "/tmp/*", "rule": "record"}
    response = confirm(
        client_for(admin_user), "files/delete_file", {"rule": "approve", "patterns": [pattern]}
    )
    assert response.status_code == 200, response.content
    assert response.json()["confirmed_by"] == "user:ada"
    changed = [dict(t) for t in TOOLS]
    changed[2] = tool("delete_file", destructiveHint=False)
    rules = {r["name"]: r for r in report(gw, changed)["rules"]}
    assert (rules["delete_file"]["rule"], rules["delete_file"]["patterns"]) == (
        "approve",
        [pattern],
    )
    assert rules["delete_file"]["confirmed"] is True
    assert rules["delete_file"]["suggested"] == "record"
    people = {r["name"]: r for r in client_for(admin_user).get(RULES_URL).json()["rules"]}
    assert people["delete_file"]["changed_since_confirmed"] is True
    assert people["read_file"]["changed_since_confirmed"] is False


def test_another_agents_gateway_is_refused_and_changes_nothing(gw: APIClient) -> None:
    other = gateway_client(token="other", agent="other-agent")
    before = state()
    problem(other.put(TOOLS_URL, {"tools": [tool("evil")]}, format="json"), 403, "agent_not_yours")
    problem(other.get(TOOLS_URL), 403, "agent_not_yours")
    assert state() == before


def test_unknown_agent_and_missing_or_wrong_credentials(gw: APIClient, admin_user: User) -> None:
    before = state()
    problem(gw.get("/api/worker/agents/nobody/mcp-tools"), 404, "not_found")
    problem(
        gw.put("/api/worker/agents/nobody/mcp-tools", {"tools": []}, format="json"),
        404,
        "not_found",
    )
    anonymous = APIClient()
    problem(anonymous.put(TOOLS_URL, {"tools": []}, format="json"), 401, "not_authenticated")
    # A person's token is not a worker's.
    person = client_for(admin_user)
    response = person.put(TOOLS_URL, {"tools": []}, format="json")
    assert response.status_code in (401, 403)
    assert response["Content-Type"] == "application/problem+json"
    assert state() == before


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "malformed_request"),
        (json.dumps({"tools": "x"}).encode(), 422, "invalid_input"),
        (json.dumps({}).encode(), 422, "invalid_input"),
        (json.dumps({"tools": [tool(f"t{n}") for n in range(501)]}).encode(), 422, "invalid_input"),
        (json.dumps({"tools": [tool("t", server="Bad Server")]}).encode(), 422, "invalid_input"),
        (json.dumps({"tools": [tool("has space")]}).encode(), 422, "invalid_input"),
        (
            json.dumps(
                {"tools": [{**tool("t"), "input_schema": {"description": "x" * 33_000}}]}
            ).encode(),
            422,
            "invalid_input",
        ),
        (json.dumps({"tools": [tool("t", readOnlyHint="yes")]}).encode(), 422, "invalid_input"),
        # PostgreSQL stores no NUL: refused before anything is written, never a 500.
        (
            json.dumps({"tools": [{**tool("t"), "description": "a\u0000b"}]}).encode(),
            422,
            "invalid_input",
        ),
    ],
)
def test_a_bad_report_is_a_problem_and_changes_nothing(
    gw: APIClient, body: bytes, status: int, code: str
) -> None:
    before = state()
    response = gw.generic("PUT", TOOLS_URL, body, content_type="application/json")
    problem(response, status, code)
    assert state() == before


def test_a_body_past_the_limit_is_refused_before_it_is_read(gw: APIClient, settings: Any) -> None:
    settings.HOLDPOINT_MAX_BODY_BYTES = 4096
    before = state()
    big = json.dumps({"tools": [{**tool("t"), "description": "d" * 2000}] * 3})
    problem(
        gw.generic("PUT", TOOLS_URL, big, content_type="application/json"), 413, "payload_too_large"
    )
    assert state() == before


# --- People ---------------------------------------------------------------------------------


def test_people_with_view_see_the_rules_others_do_not(
    gw: APIClient, viewer: User, outsider: User, admin_user: User
) -> None:
    response = client_for(viewer).get(RULES_URL)
    assert response.status_code == 200
    (row,) = [r for r in response.json()["rules"] if r["name"] == "delete_file"]
    assert row["description"] == "The delete_file tool."
    assert row["annotations"] == {"destructiveHint": True, "title": "Delete"}
    assert (row["rule"], row["confirmed_rule"], row["confirmed_by"], row["confirmed_at"]) == (
        "approve",
        None,
        "",
        None,
    )
    problem(client_for(outsider).get(RULES_URL), 403, "permission_denied")
    problem(client_for(admin_user).get("/api/agents/nobody/tool-rules"), 404, "not_found")
    problem(APIClient().get(RULES_URL), 401, "not_authenticated")


def test_an_admin_confirms_a_rule_once_per_key(gw: APIClient, admin_user: User) -> None:
    client = client_for(admin_user)
    body = {
        "rule": "record",
        "patterns": [{"argument": "path", "matches": "/etc/*", "rule": "approve"}],
    }
    first = confirm(client, "files/delete_file", body, key="same")
    assert first.status_code == 200, first.content
    row = first.json()
    assert (row["rule"], row["confirmed"], row["patterns"]) == ("record", True, body["patterns"])
    again = confirm(client, "files/delete_file", body, key="same")
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == row
    assert AgentEvent.objects.count() == 1
    # The same key for another body is a 422; no key at all is a 400.
    problem(
        confirm(client, "files/delete_file", {"rule": "pass"}, key="same"),
        422,
        "idempotency_key_reused",
    )
    problem(confirm(client, "files/delete_file", body, key=None), 400, "idempotency_key_missing")
    # A tool name with a slash is one tool.
    slash = confirm(client, "files/ns/odd.name", {"rule": "pass"}, key="k2")
    assert slash.status_code == 200, slash.content
    assert slash.json()["name"] == "ns/odd.name"


def test_the_audit_export_shows_who_confirmed_how(gw: APIClient, admin_user: User) -> None:
    client = client_for(admin_user)
    body = {"rule": "pass", "comment": "only reads, checked its code"}
    assert confirm(client, "files/read_file", body).status_code == 200
    rows = client.get("/api/audit").json()["results"]
    assert len(rows) == 1
    row = rows[0]
    fingerprint = hashlib.sha256(Token.objects.get(user=admin_user).key.encode()).hexdigest()[:12]
    assert (row["type"], row["agent"], row["run_id"], row["actor"]) == (
        "tool_rule.confirmed",
        AGENT,
        None,
        "user:ada",
    )
    assert (row["via"], row["identity"]) == ("api", f"token:{fingerprint}")
    assert "files/read_file: pass" in row["summary"]
    assert row["comment"] == "only reads, checked its code"
    only = client.get("/api/audit", {"type": "tool_rule.confirmed"}).json()["results"]
    assert len(only) == 1
    # The CSV download carries it too.
    download = client.get("/api/audit", {"format": "csv"})
    text = b"".join(download.streaming_content).decode()
    assert "tool_rule.confirmed" in text


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("files/delete_file", {"rule": "allow"}, 422, "invalid_input"),
        ("files/delete_file", {}, 422, "invalid_input"),
        (
            "files/delete_file",
            {"rule": "pass", "patterns": [{"argument": "p", "matches": "x" * 201, "rule": "pass"}]},
            422,
            "invalid_input",
        ),
        (
            "files/delete_file",
            {"rule": "pass", "patterns": [{"argument": "p", "matches": "*", "rule": "pass"}] * 21},
            422,
            "invalid_input",
        ),
        (
            "files/delete_file",
            {"rule": "pass", "patterns": [{"argument": "p", "matches": "*", "rule": "nope"}]},
            422,
            "invalid_input",
        ),
        ("files/delete_file", {"rule": "pass", "schema_hash": "0" * 64}, 409, "invalid_state"),
        ("files/no_such_tool", {"rule": "pass"}, 404, "not_found"),
        ("other/delete_file", {"rule": "pass"}, 404, "not_found"),
    ],
)
def test_a_bad_confirmation_is_a_problem_and_changes_nothing(
    gw: APIClient, admin_user: User, path: str, body: Any, status: int, code: str
) -> None:
    before = state()
    problem(confirm(client_for(admin_user), path, body), status, code)
    assert state() == before


def test_malformed_json_to_confirm_changes_nothing(gw: APIClient, admin_user: User) -> None:
    before = state()
    response = client_for(admin_user).generic(
        "PUT",
        f"{RULES_URL}/files/delete_file",
        b'{"rule": ',
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="k",
    )
    problem(response, 400, "malformed_request")
    assert state() == before


def test_without_the_permission_nothing_changes(
    gw: APIClient, operator: User, viewer: User, outsider: User, admin_user: User
) -> None:
    before = state()
    for person in (operator, viewer, outsider):
        client = client_for(person)
        problem(confirm(client, "files/delete_file", {"rule": "pass"}), 403, "permission_denied")
        response = client.post(
            f"{RULES_URL}/confirm-suggested", {}, format="json", HTTP_IDEMPOTENCY_KEY="k"
        )
        problem(response, 403, "permission_denied")
    problem(
        confirm(client_for(admin_user).__class__(), "files/delete_file", {"rule": "pass"}),
        401,
        "not_authenticated",
    )
    problem(
        confirm(client_for(admin_user), "files/delete_file", {"rule": "pass"}, key="x" * 300),
        400,
        "idempotency_key_malformed",
    )
    assert state() == before


def test_confirm_suggested_confirms_every_unconfirmed_tool(gw: APIClient, admin_user: User) -> None:
    client = client_for(admin_user)
    assert confirm(client, "files/read_file", {"rule": "approve"}).status_code == 200
    response = client.post(
        f"{RULES_URL}/confirm-suggested", {}, format="json", HTTP_IDEMPOTENCY_KEY="all"
    )
    assert response.status_code == 200, response.content
    rules = {r["name"]: r["rule"] for r in response.json()["rules"]}
    assert rules == {
        "read_file": "approve",  # a person's choice stays
        "append_log": "record",
        "delete_file": "approve",
        "ns/odd.name": "approve",
    }
    assert AgentEvent.objects.count() == 4
    gateway_view = {
        r["name"]: (r["rule"], r["confirmed"]) for r in gw.get(TOOLS_URL).json()["rules"]
    }
    assert gateway_view["append_log"] == ("record", True)


def test_confirmations_are_throttled(gw: APIClient, admin_user: User, settings: Any) -> None:
    settings.HOLDPOINT_THROTTLE_USER = "2/min"
    client = client_for(admin_user)
    assert confirm(client, "files/read_file", {"rule": "pass"}, key="a").status_code == 200
    assert client.get(RULES_URL).status_code == 200
    before = state()
    body = problem(confirm(client, "files/append_log", {"rule": "pass"}, key="b"), 429, "throttled")
    assert body["retry_after"] > 0
    assert state() == before


# --- Fuzz -----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
tool_bodies = st.fixed_dictionaries(
    {
        "server": st.sampled_from(["files", "", "F", "a" * 65]) | st.text(max_size=10),
        "name": st.sampled_from(["t", "", "a b"]) | st.text(max_size=10),
    },
    optional={
        "description": json_values,
        "input_schema": json_values,
        "annotations": st.dictionaries(
            st.sampled_from(["readOnlyHint", "destructiveHint", "title", "x"]), json_values
        ),
    },
)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    report_body=st.one_of(
        json_values, st.fixed_dictionaries({"tools": st.lists(tool_bodies, max_size=3)})
    ),
    confirm_body=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"rule": st.sampled_from(["pass", "record", "approve", "x"]) | json_values},
            optional={
                "patterns": st.lists(
                    st.fixed_dictionaries(
                        {
                            "argument": st.text(max_size=5) | json_values,
                            "matches": st.text(max_size=5) | json_values,
                            "rule": st.sampled_from(["pass", "x"]),
                        }
                    ),
                    max_size=3,
                )
                | json_values
            },
        ),
    ),
)
def test_random_bodies_never_break_it(
    gw: APIClient, admin_user: User, report_body: Any, confirm_body: Any
) -> None:
    before = state()
    response = gw.put(TOOLS_URL, report_body, format="json")
    assert response.status_code in (200, 400, 422), response.content
    if response.status_code != 200:
        assert response["Content-Type"] == "application/problem+json"
        assert state() == before
    middle = state()
    answer = confirm(client_for(admin_user), "files/read_file", confirm_body, key=uuid.uuid4().hex)
    assert answer.status_code in (200, 400, 404, 409, 422), answer.content
    if answer.status_code != 200:
        assert answer["Content-Type"] == "application/problem+json"
        assert state() == middle


# --- The audit trail merges runs' and agents' events ---------------------------------------


def _pages(client: APIClient, url: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    next_url: str | None = url
    while next_url:
        page = client.get(next_url)
        assert page.status_code == 200, page.content
        seen += page.json()["results"]
        next_url = page.json()["next"]
    return seen


def test_the_trail_pages_runs_and_rule_changes_of_one_instant_exactly_once(
    gw: APIClient, admin_user: User, settings: Any
) -> None:
    client = client_for(admin_user)
    # Everything at one instant: the order rests on (source, id) alone.
    with time_machine.travel(dt.datetime(2026, 12, 5, 1, 0, tzinfo=dt.UTC), tick=False):
        for n, name in enumerate(["read_file", "append_log", "delete_file"]):
            run = start()
            services.run_cancel(run_id=run.id, user=admin_user, reason=f"r{n}")
            assert (
                confirm(client, f"files/{name}", {"rule": "pass"}, key=f"k{n}").status_code == 200
            )
    # And some at other times, before and after.
    assert confirm(client, "files/ns/odd.name", {"rule": "record"}, key="later").status_code == 200
    whole = client.get("/api/audit", {"limit": 200}).json()["results"]
    assert len(whole) == 10
    assert _pages(client, "/api/audit?limit=1") == whole
    assert _pages(client, "/api/audit?limit=3") == whole
    frozen = [row["type"] for row in whole[1:]]
    # Of one instant, the runs' events come first (newest first), then the agents'.
    assert frozen == ["run.cancel_requested", "run.created"] * 3 + ["tool_rule.confirmed"] * 3
    assert [row["summary"].split(":")[0] for row in whole if row["run_id"] is None] == [
        "rule of files/ns/odd.name",
        "rule of files/delete_file",
        "rule of files/append_log",
        "rule of files/read_file",
    ]
    # A filter on a run leaves the agents' events out; on the agent event type, the runs'.
    only_rules = _pages(client, "/api/audit?type=tool_rule.confirmed&limit=2")
    assert [row["type"] for row in only_rules] == ["tool_rule.confirmed"] * 4
    a_run = whole[1]["run_id"]
    assert {row["run_id"] for row in _pages(client, f"/api/audit?run={a_run}")} == {a_run}
    # The CSV download is bounded across both and its Link continues exactly after it.
    settings.HOLDPOINT_AUDIT_CSV_MAX_ROWS = 4
    rows: list[list[str]] = []
    url: str | None = "/api/audit?format=csv"
    downloads = 0
    while url:
        response = client.get(url)
        text = b"".join(response.streaming_content).decode()
        body = list(csv.reader(io.StringIO(text)))[1:]
        assert len(body) <= 4
        rows += body
        downloads += 1
        link = response.get("Link")
        url = link[1 : link.index(">")] if link else None
    assert downloads == 3
    assert [(row[3], row[9]) for row in rows] == [(r["type"], r["summary"]) for r in whole]


@pytest.mark.postgres
def test_the_agents_events_are_read_by_their_indexes(gw: APIClient, admin_user: User) -> None:
    confirm(client_for(admin_user), "files/read_file", {"rule": "pass"})
    plans = {}
    for name, where in {"all": AuditFilter(), "actor": AuditFilter(actor="ada")}.items():
        sql, params = agent_audit_events(where).values("id")[:50].query.sql_with_params()
        with connection.cursor() as cursor:
            # A tiny table is read sequentially (or sorted) whatever the indexes: forbid
            # both, and the plan shows whether an index gives the rows in the page's order.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute(f"EXPLAIN {sql}", params)
            plans[name] = "\n".join(row[0] for row in cursor.fetchall())
    assert "Scan using agent_event_audit_idx" in plans["all"], plans["all"]
    assert "Scan using agent_event_audit_actor_idx" in plans["actor"], plans["actor"]
    assert "Sort" not in plans["all"] + plans["actor"]
