"""Issue 25: the Workers page as the server renders it (who may see it, what a row says,
the same queries for any number of workers), and why queued runs wait in the runs list
(its queries do not grow with the runs it shows)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.workers import PROCESS, Identity, principal_for_token
from tests.conftest import TEST_AGENT
from tests.runs.factory import claim, start

pytestmark = pytest.mark.django_db


def seen(name: str, *, remote: bool = False, **extra: object) -> None:
    services.worker_seen(
        identity=Identity(
            name=name,
            principal=principal_for_token("edge") if remote else PROCESS,
            kind="remote" if remote else "process",
            agents=(TEST_AGENT,),
            lease_seconds=60,
            **extra,  # type: ignore[arg-type]
        )
    )


def test_operators_see_the_workers_page_and_the_nav_link(client: Client, operator: User) -> None:
    seen("host-a:1", host="host-a", pid=1, client="holdpoint-runtime")
    seen('<script>alert("x")</script>', remote=True)
    client.force_login(operator)
    response = client.get("/workers/")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<a href="/workers/" aria-current="page">Workers</a>' in html
    assert 'data-worker="host-a:1" data-state="alive"' in html
    assert "In process" in html and "Remote, token edge" in html
    assert "<script>alert" not in html  # a worker's name is text
    assert 'ws-connect="/ws/workers/?v=' in html


def test_who_may_not_see_it(client: Client, viewer: User, approver: User) -> None:
    for user in (viewer, approver):
        client.force_login(user)
        assert client.get("/workers/").status_code == 403
        assert 'href="/workers/"' not in client.get("/runs/").content.decode()
    client.logout()
    assert client.get("/workers/").status_code == 302
    client.force_login(viewer)
    assert client.post("/workers/").status_code in (403, 405)


def test_the_page_costs_the_same_queries_for_any_number_of_workers(
    client: Client, operator: User
) -> None:
    client.force_login(operator)
    seen("w-0")

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/workers/").status_code == 200
        return len(queries)

    one = count()
    for i in range(1, 8):
        seen(f"w-{i}")
        start()
        claim(f"w-{i}/1")
    assert count() == one


def test_the_runs_list_says_why_queued_runs_wait_in_bounded_queries(
    client: Client, operator: User
) -> None:
    client.force_login(operator)
    services.agent_pause(agent=TEST_AGENT, reason="INC-9", user=operator)
    start()

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            response = client.get("/runs/")
        assert response.status_code == 200
        assert (
            "Held: agent paused by <bdi>olivia</bdi>, <bdi>INC-9</bdi>" in response.content.decode()
        )
        return len(queries)

    one = count()
    for i in range(10):
        start(input={"n": i})
    assert count() == one
