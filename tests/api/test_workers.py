"""Issue 25, point 1: every worker, seen by people. ``GET /api/workers`` lists remote
workers by the identity their headers state (name, client and version, host and pid,
agents, concurrency), in-process pools by their own, each alive, stale or gone by its last
contact against its lease, with what it runs now and its recent lease losses. Contact is
written at a bounded rate, and the list costs the same queries for any number of workers.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from runs import services
from runs.events import Changes
from runs.models import Attempt, Worker
from runs.services.workers import forget_contacts
from runs.workers import PROCESS, Identity
from tests.api.conftest import client_for, worker_client
from tests.conftest import TEST_AGENT
from tests.runs.factory import claim, start

pytestmark = pytest.mark.django_db

PROBLEM = "application/problem+json"


def headers(name: str = "deploy-fleet-1", **extra: str) -> dict[str, str]:
    values = {
        "Name": name,
        "Client": "holdpoint-client-python/0.1.0",
        "Host": "build-7",
        "Pid": "4242",
        "Concurrency": "3",
        "Agents": f"{TEST_AGENT},other-agent",
        "Lease-Seconds": "30",
        "Wait-Seconds": "20",
        **extra,
    }
    return {f"HTTP_HOLDPOINT_WORKER_{k.upper().replace('-', '_')}": v for k, v in values.items()}


def remote_claim(worker: APIClient, name: str = "deploy-fleet-1", **extra: str) -> Any:
    return worker.post(
        "/api/worker/claim",
        {"worker_id": f"{name}/1", "agents": [TEST_AGENT], "wait": 0},
        format="json",
        **headers(name, **extra),
    )


def listed(user: Any) -> list[dict[str, Any]]:
    response = client_for(user).get("/api/workers")
    assert response.status_code == 200, response.content
    return response.json()


def test_it_lists_a_remote_worker_as_its_headers_say_with_what_it_runs(operator) -> None:
    worker = worker_client("fleet")
    assert remote_claim(worker).status_code == 204
    [row] = listed(operator)
    assert row["name"] == "deploy-fleet-1"
    assert (row["kind"], row["token"]) == ("remote", "fleet")
    assert (row["client"], row["client_version"]) == ("holdpoint-client-python", "0.1.0")
    assert (row["host"], row["pid"], row["concurrency"]) == ("build-7", 4242, 3)
    assert row["agents"] == ["other-agent", TEST_AGENT]
    assert (row["state"], row["running"], row["lease_losses_24h"]) == ("alive", [], 0)

    run = start()
    response = remote_claim(worker)
    assert response.status_code == 200
    [row] = listed(operator)
    assert [(a["run_id"], a["attempt_id"]) for a in row["running"]] == [
        (run.id, response.json()["attempt_id"])
    ]


def test_an_in_process_pool_is_a_worker_until_it_stops(operator) -> None:
    identity = Identity(
        name="host-a:100",
        principal=PROCESS,
        kind="process",
        client="holdpoint-runtime",
        host="host-a",
        pid=100,
        concurrency=2,
        agents=(TEST_AGENT,),
        lease_seconds=60,
    )
    services.worker_seen(identity=identity)
    run = start()
    lease = claim("host-a:100/2")
    [row] = listed(operator)
    assert (row["name"], row["kind"], row["token"], row["state"]) == (
        "host-a:100",
        "process",
        "",
        "alive",
    )
    assert [a["run_id"] for a in row["running"]] == [run.id]
    assert row["running"][0]["attempt_id"] == lease.attempt_id
    assert services.worker_stopped(principal=PROCESS, name="host-a:100")
    [row] = listed(operator)
    assert row["state"] == "gone" and row["stopped_at"] is not None


def silent_for(seconds: float) -> None:
    """As if every worker's last contact was ``seconds`` earlier (the database's clock
    judges presence on PostgreSQL, where travelling in time would not move it)."""
    back = dt.timedelta(seconds=seconds)
    Worker.objects.update(
        last_seen_at=F("last_seen_at") - back,
        stale_at=F("stale_at") - back,
        gone_at=F("gone_at") - back,
    )


def test_it_goes_stale_then_gone_as_its_lease_passes_and_the_sweep_says_so(
    operator, django_capture_on_commit_callbacks
) -> None:
    worker = worker_client("fleet")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        remote_claim(worker)  # lease 30 s, wait 20 s: alive for 30 + twice 5 s after contact
    [appeared] = [c for c in callbacks if isinstance(c, Changes)]
    assert appeared.worker_ids == {str(Worker.objects.get().pk)}
    silent_for(35)
    assert listed(operator)[0]["state"] == "alive"
    silent_for(6)
    assert listed(operator)[0]["state"] == "stale"
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert services.workers_sweep() == 1
    [pushed] = [c for c in callbacks if isinstance(c, Changes)]
    assert pushed.worker_ids == {str(Worker.objects.get().pk)}
    assert Worker.objects.get().state == "stale"
    assert services.workers_sweep() == 0  # said once
    silent_for(80)
    assert listed(operator)[0]["state"] == "gone"
    assert services.workers_sweep() == 1
    assert Worker.objects.get().state == "gone"
    # Back: alive again, since now. (This process wrote it "lately" by its own clock:
    # forget that, as two minutes of real silence would.)
    forget_contacts()
    remote_claim(worker)
    [row] = listed(operator)
    assert row["state"] == "alive"
    assert Worker.objects.get().state == "alive"


def test_it_shows_the_leases_a_worker_lost(operator) -> None:
    worker = worker_client("fleet")
    run = start()
    lost = remote_claim(worker)
    assert lost.status_code == 200
    Attempt.objects.filter(pk=lost.json()["attempt_id"]).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=300)
    )
    assert services.leases_expire() == 1
    [row] = listed(operator)
    assert row["lease_losses_24h"] == 1
    assert [(a["run_id"], a["attempt_id"]) for a in row["lease_losses"]] == [
        (run.id, lost.json()["attempt_id"])
    ]


def test_a_worker_without_identity_headers_is_named_by_its_claims(operator) -> None:
    worker = worker_client("bare")
    response = worker.post(
        "/api/worker/claim", {"worker_id": "go-worker/7", "wait": 0}, format="json"
    )
    assert response.status_code == 204
    [row] = listed(operator)
    assert (row["name"], row["token"], row["client"]) == ("go-worker", "bare", "")


def test_contact_is_written_at_a_bounded_rate() -> None:
    worker = worker_client("fleet")
    remote_claim(worker)
    with CaptureQueriesContext(connection) as queries:
        for _ in range(5):
            assert remote_claim(worker).status_code == 204
    writes = [q["sql"] for q in queries.captured_queries if '"runs_worker"' in q["sql"]]
    assert writes == []
    # What it says changed (a restart: another pid): written at once, since anew.
    before = Worker.objects.get().since
    remote_claim(worker, Pid="4343")
    row = Worker.objects.get()
    assert row.pid == 4343 and row.since >= before


@pytest.mark.parametrize(
    "bad",
    [
        {"Name": "x" * 101},
        {"Pid": "many"},
        {"Concurrency": "0"},
        {"Wait-Seconds": "nan"},
        {"Agents": ",".join(f"a{i}" for i in range(101))},
        {"Host": "h" * 201},
        {"Name": "tab\there"},
    ],
)
def test_it_refuses_identity_headers_past_their_limits(bad: dict[str, str]) -> None:
    response = remote_claim(worker_client("fleet"), **bad)
    assert response.status_code == 400, response.content
    assert response["Content-Type"].startswith(PROBLEM)
    assert response.json()["code"] == "malformed_request"
    assert not Worker.objects.exists()


def test_who_may_see_the_workers(operator, viewer, outsider, admin_user) -> None:
    remote_claim(worker_client("fleet"))
    assert client_for(admin_user).get("/api/workers").status_code == 200
    for user in (viewer, outsider):
        response = client_for(user).get("/api/workers")
        assert response.status_code == 403
        assert response.json()["code"] == "permission_denied"
    anonymous = APIClient().get("/api/workers")
    assert anonymous.status_code == 401 and anonymous["Content-Type"].startswith(PROBLEM)
    assert worker_client("other").get("/api/workers").status_code in (401, 403)
    assert client_for(operator).post("/api/workers").status_code == 405


def test_it_is_throttled_per_person(operator, settings) -> None:
    settings.HOLDPOINT_THROTTLE_USER = "3/min"
    client = client_for(operator)
    statuses = [client.get("/api/workers").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]


def test_the_list_costs_the_same_queries_for_any_number_of_workers(operator) -> None:
    client = client_for(operator)
    token = worker_client("fleet")

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/api/workers").status_code == 200
        return len(queries)

    remote_claim(token, name="w-0")
    one = count()
    for i in range(1, 8):
        start()
        remote_claim(token, name=f"w-{i}")
    assert len(listed(operator)) == 8
    assert count() == one
