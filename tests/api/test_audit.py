"""``GET /api/audit`` (issue 28): decisions and control operations across runs, each with
how it was made (via) and with which credential (identity), paged by cursor, as CSV with
the formula guard; only for ``runs.view_audit``; bad queries are problems, never 500s."""

from __future__ import annotations

import csv
import hashlib
import io
import re
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.db import connection
from django.test import AsyncClient, Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from ledger.notifications import notifications_send
from runs import services
from runs.audit_log import AuditFilter, audit_events
from runs.events import EventType
from runs.models import RunEvent
from tests.api.conftest import client_for, post
from tests.api.test_pause import problem
from tests.conftest import on_postgres
from tests.dashboard.test_action_links import approval, confirm, links_for, person
from tests.runs.factory import claim, epochs, interrupted, start

pytestmark = pytest.mark.django_db

URL = "/api/audit"


def rows(client: APIClient, **query: Any) -> list[dict[str, Any]]:
    response = client.get(URL, query)
    assert response.status_code == 200, response.content
    return response.json()["results"]


def csv_of(response: Any) -> list[list[str]]:
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="holdpoint-audit-')
    text = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(text)))


def fingerprint(user: User) -> str:
    key = Token.objects.get(user=user).key
    return "token:" + hashlib.sha256(key.encode()).hexdigest()[:12]


def cancelled_runs(user: User, count: int, reason: str = "r") -> list[str]:
    ids = []
    for n in range(count):
        run = start()
        services.run_cancel(run_id=run.id, user=user, reason=f"{reason} {n}")
        ids.append(run.id)
    return ids


# --- Each door records how and with which credential --------------------------------------


def test_the_api_records_the_token_and_the_session(admin_user: User) -> None:
    token_run, session_run = start(), start()
    client = client_for(admin_user)
    assert (
        post(client, f"/api/runs/{token_run.id}/cancel", {"reason": "t"}, key="k1").status_code
        == 202
    )
    session = APIClient()
    session.force_login(admin_user)
    assert post(session, f"/api/runs/{session_run.id}/cancel", {}, key="k2").status_code == 202
    found = {r["run_id"]: r for r in rows(client, type="run.cancel_requested")}
    assert (found[token_run.id]["via"], found[token_run.id]["identity"]) == (
        "api",
        fingerprint(admin_user),
    )
    assert (found[session_run.id]["via"], found[session_run.id]["identity"]) == (
        "api",
        "session:password",
    )
    # The key itself (a secret) is nowhere in the trail.
    key = Token.objects.get(user=admin_user).key
    assert key not in str(list(RunEvent.objects.values_list("payload", flat=True)))


def test_a_dashboard_post_records_the_session(admin_user: User) -> None:
    run = start()
    browser = Client()
    browser.force_login(admin_user)
    response = browser.post(
        f"/runs/{run.id}/cancel", {"idempotency_key": "c1", "run_id": run.id, "reason": "x"}
    )
    assert response.status_code in (302, 303), response.status_code
    [row] = rows(client_for(admin_user), run=run.id, type="run.cancel_requested")
    assert (row["via"], row["identity"], row["actor"]) == (
        "dashboard",
        "session:password",
        "user:ada",
    )
    assert (row["summary"], row["comment"]) == ("cancel", "x")


def test_an_e_mail_link_records_email_link(admin_user: User, settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = {}
    settings.HOLDPOINT_PUBLIC_URL = "https://holdpoint.example"
    alice = person("alice")
    req = approval()
    notifications_send()
    browser = Client()
    browser.force_login(alice)
    assert confirm(browser, links_for(alice)["approve"], comment="from my phone").status_code == 303
    [row] = rows(client_for(admin_user), type="request.answered")
    assert row["request_id"] == req.id and row["actor"] == "user:alice"
    assert (row["via"], row["identity"]) == ("email", "email-link")
    assert (row["decision"], row["summary"], row["comment"]) == (
        "approve",
        "approve",
        "from my phone",
    )


def test_a_command_records_cli_and_the_shell_account(admin_user: User) -> None:
    run = start()
    call_command("cancelrun", run.id, "--reason", "from the shell", stdout=io.StringIO())
    [row] = rows(client_for(admin_user), type="run.cancel_requested")
    assert (row["run_id"], row["actor"], row["via"]) == (run.id, "cli", "cli")
    assert re.fullmatch(r"shell(:.+)?", row["identity"]), row["identity"]


def test_a_system_action_has_no_door_and_is_not_a_decision(admin_user: User) -> None:
    run = start()  # by the system: run.created, with neither member
    lease = claim()
    services.checkpoint_save(**epochs(lease), step="one", state={})
    # Claims, checkpoints and the like are no decisions: they are not rows.
    assert RunEvent.objects.filter(run=run).count() == 3
    [row] = rows(client_for(admin_user))
    assert (row["run_id"], row["type"], row["actor"]) == (run.id, "run.created", "system")
    assert (row["via"], row["identity"], row["summary"]) == ("", "", "start")


def test_approvals_say_the_decision_and_bound_long_text(admin_user: User, approver: User) -> None:
    run, _lease, cp, req = interrupted(kind="auth_required")
    question, _l, qcp, qreq = interrupted(schema={"type": "object"})
    services.run_resume(
        run_id=run.id,
        request_id=req.id,
        checkpoint_id=cp.id,
        value={"decision": "deny", "comment": "no " * 600},
        user=approver,
        via="api",
        identity="session",
    )
    services.run_resume(
        run_id=question.id,
        request_id=qreq.id,
        checkpoint_id=qcp.id,
        value={"versions": ["v" * 5000]},
        user=admin_user,
    )
    client = client_for(admin_user)
    [denied] = rows(client, run=run.id, type="request.answered")
    assert (denied["decision"], denied["summary"], denied["via"]) == ("deny", "deny", "api")
    assert len(denied["comment"]) == 500 and denied["comment"].endswith("…")
    [answered] = rows(client, run=question.id, type="request.answered")
    assert answered["decision"] is None
    # The answer's JSON as the database writes it (PostgreSQL puts spaces after colons).
    assert answered["summary"].replace(" ", "").startswith('answer:{"versions":["vvv')
    assert len(answered["summary"]) <= 200 and answered["summary"].endswith("…")


# --- Paging, filters ----------------------------------------------------------------------


def test_paging_is_stable_while_new_events_arrive(admin_user: User) -> None:
    ids = cancelled_runs(admin_user, 4)  # 4 runs x (created, cancel_requested) = 8 rows
    client = client_for(admin_user)
    everything = [(r["run_id"], r["type"]) for r in rows(client, limit=200)]
    assert len(everything) == 8 and everything[0] == (ids[-1], "run.cancel_requested")
    first = client.get(URL, {"limit": 3}).json()
    seen = [(r["run_id"], r["type"]) for r in first["results"]]
    # New decisions arrive between the pages: they are newer than page one, so they
    # neither shift nor repeat what the following pages show.
    cancelled_runs(admin_user, 2, reason="late")
    next_url = first["next"]
    while next_url:
        page = client.get(next_url).json()
        assert len(page["results"]) <= 3
        seen += [(r["run_id"], r["type"]) for r in page["results"]]
        next_url = page["next"]
    assert seen == everything
    # The cursor is opaque but keeps the other filters in the link.
    first_of_one = client.get(URL, {"limit": 1, "type": "run.created"}).json()
    assert parse_qs(urlparse(first_of_one["next"]).query)["type"] == ["run.created"]


def test_it_filters_by_time_person_run_and_type(admin_user: User, operator: User) -> None:
    mine = cancelled_runs(operator, 2)
    theirs = cancelled_runs(admin_user, 1)
    client = client_for(admin_user)
    by_olivia = rows(client, actor="olivia")
    assert {r["run_id"] for r in by_olivia} == set(mine)
    assert rows(client, actor="user:olivia") == by_olivia
    assert {r["run_id"] for r in rows(client, actor="system")} == set(mine + theirs)  # starts
    assert [r["type"] for r in rows(client, run=theirs[0])] == [
        "run.cancel_requested",
        "run.created",
    ]
    assert len(rows(client, type="run.cancel_requested")) == 3
    newest = RunEvent.objects.filter(type="run.cancel_requested").order_by("-created_at").first()
    assert newest is not None
    at = newest.created_at
    assert rows(client, since=at.isoformat(), type="run.cancel_requested")[0]["run_id"] == theirs[0]
    assert all(
        r["run_id"] != theirs[0] or r["type"] != "run.cancel_requested"
        for r in rows(client, until=at.isoformat())
    )
    assert rows(client, run="run_nothing") == []


# --- CSV ----------------------------------------------------------------------------------


NASTY = ['=HYPERLINK("http://evil","x")', "+1+2", "-3", "@SUM(A1)", "\tx", "\rx", 'a,"b"\nc']


def test_the_csv_has_a_header_the_rows_and_no_formula(admin_user: User) -> None:
    for reason in NASTY:
        services.run_cancel(run_id=start().id, user=admin_user, reason=reason)
    client = client_for(admin_user)
    table = csv_of(client.get(URL, {"format": "csv"}))
    assert table[0] == [
        "time",
        "run_id",
        "agent",
        "type",
        "actor",
        "via",
        "identity",
        "request_id",
        "decision",
        "summary",
        "comment",
    ]
    data = table[1:]
    json_rows = rows(client, limit=200)
    assert [(r[1], r[3]) for r in data] == [(r["run_id"], r["type"]) for r in json_rows]
    assert data[0][0] == json_rows[0]["time"]
    comments = [r[10] for r in data if r[3] == "run.cancel_requested"]
    assert sorted(comments) == sorted(["'" + c if c[0] in "=+-@\t\r" else c for c in NASTY])
    assert all(not cell.startswith(("=", "+", "-", "@", "\t", "\r")) for r in data for cell in r)


def test_accept_text_csv_chooses_the_download_too(admin_user: User) -> None:
    start()
    response = client_for(admin_user).get(URL, HTTP_ACCEPT="text/csv")
    assert len(csv_of(response)) == 2


def test_a_download_is_bounded_and_its_link_continues_it(admin_user: User, settings: Any) -> None:
    settings.HOLDPOINT_AUDIT_CSV_MAX_ROWS = 3
    cancelled_runs(admin_user, 3)  # 6 rows
    client = client_for(admin_user)
    response = client.get(URL, {"format": "csv", "type": "run.created"})
    assert "Link" not in response and len(csv_of(response)) == 4  # 3 rows fit exactly
    first = client.get(URL, {"format": "csv"})
    assert first["Holdpoint-Audit-Truncated"] == "true"
    assert len(csv_of(first)) == 4
    link = re.fullmatch(r'<([^>]+)>; rel="next"', first["Link"])
    assert link is not None
    second = client.get(link.group(1))
    assert "Link" not in second and len(csv_of(second)) == 4
    every = [(r["run_id"], r["type"]) for r in rows(client, limit=200)]
    parts = [(r[1], r[3]) for r in csv_of(client.get(URL, {"format": "csv"}))[1:]]
    parts += [(r[1], r[3]) for r in csv_of(client.get(link.group(1)))[1:]]
    assert parts == every


def test_an_asgi_server_streams_the_download_chunk_by_chunk(
    admin_user: User, settings: Any
) -> None:
    """Under ASGI (uvicorn in production) the rows are an async iterator: Django would
    otherwise read a plain iterator whole before sending a byte."""
    cancelled_runs(admin_user, 3)
    key = Token.objects.get_or_create(user=admin_user)[0].key

    async def download() -> tuple[bool, bytes]:
        response = await AsyncClient().get(
            URL, {"format": "csv"}, headers={"Authorization": f"Token {key}"}
        )
        assert response.status_code == 200
        return response.is_async, b"".join([piece async for piece in response])

    is_async, body = async_to_sync(download)()
    assert is_async
    table = list(csv.reader(io.StringIO(body.decode())))
    assert len(table) == 1 + 6 and table[1][3] == "run.cancel_requested"


# --- Who may, bad input, throttle, fuzz ---------------------------------------------------


def test_only_admins_and_superusers_may_read_the_trail(
    admin_user: User, operator: User, approver: User, viewer: User, outsider: User
) -> None:
    start()
    for person_ in (operator, approver, viewer, outsider):
        body = problem(client_for(person_).get(URL), 403, "permission_denied")
        assert body["detail"] == "Only admins can export the audit trail."
        problem(client_for(person_).get(URL, {"format": "csv"}), 403, "permission_denied")
    problem(APIClient().get(URL), 401, "not_authenticated")
    boss = User.objects.create_superuser("root", password="pw")
    assert len(rows(client_for(boss))) == 1
    assert len(rows(client_for(admin_user))) == 1
    assert Group.objects.get(name="admin").permissions.filter(codename="view_audit").exists()
    problem(client_for(admin_user).post(URL, {}), 405, "method_not_allowed")


@pytest.mark.parametrize(
    ("query", "pointer"),
    [
        ({"cursor": "not-a-cursor"}, "/cursor"),
        ({"cursor": "WyJ4IiwxXQ"}, "/cursor"),  # ["x", 1]
        ({"since": "yesterday"}, "/since"),
        ({"until": "2026-13-40T00:00:00Z"}, "/until"),
        ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "/until"),
        ({"limit": "0"}, "/limit"),
        ({"limit": "201"}, "/limit"),
        ({"limit": "many"}, "/limit"),
        ({"type": "attempt.claimed"}, "/type"),
        ({"format": "xml"}, "/format"),
        ({"actor": "x" * 201}, "/actor"),
    ],
)
def test_it_refuses_bad_queries_with_a_pointer(
    admin_user: User, query: dict[str, str], pointer: str
) -> None:
    start()
    count = RunEvent.objects.count()
    body = problem(client_for(admin_user).get(URL, query), 422, "invalid_input")
    assert pointer in [e["pointer"] for e in body["errors"]]
    assert RunEvent.objects.count() == count


def test_the_trail_is_throttled_like_every_read(admin_user: User, settings: Any) -> None:
    settings.HOLDPOINT_THROTTLE_USER = "2/min"
    client = client_for(admin_user)
    assert client.get(URL).status_code == 200
    assert client.get(URL, {"format": "csv"}).status_code == 200
    body = problem(client.get(URL), 429, "throttled")
    assert body["retry_after"] > 0


QUERY_KEYS = ["since", "until", "actor", "run", "type", "cursor", "limit", "format", "x"]
values = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            "0",
            "-1",
            "200",
            "1e9",
            "csv",
            "json",
            "0001-01-01T00:00:00+14:00",
            "9999-12-31T23:59:59-14:00",
            "2026-12-04T10:00:00",
            "run.created",
            "user:ada",
            "WzEsMl0",
            "W1siMjAyNi0wMS0wMVQwMDowMDowMCswMDowMCIsMV1d",
        ]
    ),
)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(query=st.lists(st.tuples(st.sampled_from(QUERY_KEYS), values), max_size=5))
def test_random_queries_never_break_it(admin_user: User, query: list[tuple[str, str]]) -> None:
    client = client_for(admin_user)
    response = client.get(URL + "?" + urlencode(query))
    assert response.status_code in (200, 400, 404, 406, 422), response.content
    if response.status_code != 200:
        assert response["Content-Type"] == "application/problem+json"
    elif response["Content-Type"].startswith("text/csv"):
        b"".join(response.streaming_content)
    else:
        assert isinstance(response.json()["results"], list)


# --- The index ----------------------------------------------------------------------------


@pytest.mark.postgres
def test_the_queries_are_served_by_the_partial_indexes(admin_user: User) -> None:
    cancelled_runs(admin_user, 3)
    plans = {}
    for name, where in {
        "all": AuditFilter(),
        "type": AuditFilter(type=EventType.RUN_CANCEL_REQUESTED),
        "actor": AuditFilter(actor="ada"),
    }.items():
        sql, params = audit_events(where).values("id")[:50].query.sql_with_params()
        with connection.cursor() as cursor:
            # A tiny table is read sequentially whatever the indexes: forbid that, and the
            # plan shows whether an index can serve the query at all.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(f"EXPLAIN {sql}", params)
            plans[name] = "\n".join(row[0] for row in cursor.fetchall())
    assert on_postgres()
    assert "event_audit_idx" in plans["all"], plans["all"]
    assert "event_audit_idx" in plans["type"], plans["type"]
    assert "event_audit_actor_idx" in plans["actor"], plans["actor"]
