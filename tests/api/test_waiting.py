"""Issue 25, point 2: a queued run says why it is not running, in its representation
(``GET /api/runs/{id}`` and the list): ``waiting`` is ``{reason, agent, since, until, by,
detail, workers}`` with a stable ``reason`` (``agent_paused``, ``backing_off``,
``no_worker``, ``ready``), and null for a run that is not waiting to be claimed."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.models import Worker
from runs.workers import PROCESS, Identity
from tests.api.conftest import client_for
from tests.conftest import TEST_AGENT
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db


def seen(name: str = "host-a:1", agents: tuple[str, ...] = (TEST_AGENT,)) -> None:
    services.worker_seen(
        identity=Identity(
            name=name, principal=PROCESS, kind="process", agents=agents, lease_seconds=60
        )
    )


def waiting_of(user: Any, run_id: str) -> Any:
    response = client_for(user).get(f"/api/runs/{run_id}")
    assert response.status_code == 200
    return response.json()["waiting"]


def test_a_run_nobody_serves_says_so_and_since_when(operator) -> None:
    run = start()
    assert waiting_of(operator, run.id) == {
        "reason": "no_worker",
        "agent": TEST_AGENT,
        "since": None,
        "until": None,
        "by": None,
        "detail": "",
        "workers": 0,
    }
    seen("other:1", agents=("another-agent",))  # serves something else: no help
    assert waiting_of(operator, run.id)["reason"] == "no_worker"
    seen("host-a:1")
    waiting = waiting_of(operator, run.id)
    assert (waiting["reason"], waiting["workers"]) == ("ready", 1)
    # The worker falls silent: after its lease (60 s) and twice the write interval, no live
    # worker serves the agent, since its last contact.
    back = dt.timedelta(seconds=71)
    Worker.objects.update(
        last_seen_at=F("last_seen_at") - back,
        stale_at=F("stale_at") - back,
        gone_at=F("gone_at") - back,
    )
    last = Worker.objects.get(name="host-a:1").last_seen_at
    waiting = waiting_of(operator, run.id)
    assert (waiting["reason"], waiting["by"], waiting["workers"]) == ("no_worker", "host-a:1", 0)
    assert dt.datetime.fromisoformat(waiting["since"]) == last


def test_a_paused_agent_holds_its_queued_runs_and_says_who_and_why(operator) -> None:
    seen()
    run = start()
    services.agent_pause(agent=TEST_AGENT, reason="INC-42 database failover", user=operator)
    waiting = waiting_of(operator, run.id)
    assert (waiting["reason"], waiting["by"], waiting["detail"]) == (
        "agent_paused",
        "olivia",
        "INC-42 database failover",
    )
    assert waiting["since"] is not None
    services.agent_unpause(agent=TEST_AGENT, user=operator)
    assert waiting_of(operator, run.id)["reason"] == "ready"


def test_a_run_backing_off_says_until_when(operator) -> None:
    seen()
    run = start()
    lease = claim()
    services.attempt_fail(**epochs(lease), error={"class": "transient", "type": "Timeout"})
    run.refresh_from_db()
    assert run.status == "waiting"
    waiting = waiting_of(operator, run.id)
    assert waiting["reason"] == "backing_off"
    assert dt.datetime.fromisoformat(waiting["until"]) == run.not_before


def test_only_runs_waiting_to_be_claimed_have_a_reason(operator) -> None:
    running = start()
    claim()
    queued = start()
    response = client_for(operator).get("/api/runs")
    by_id = {r["run_id"]: r for r in response.json()["results"]}
    assert by_id[queued.id]["waiting"]["reason"] == "no_worker"
    assert by_id[running.id]["status"] == "running"
    assert by_id[running.id]["waiting"] is None


def test_the_list_reads_why_runs_wait_in_the_same_queries_for_any_number(operator) -> None:
    client = client_for(operator)
    seen()

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/api/runs").status_code == 200
        return len(queries)

    start()
    one = count()
    for i in range(10):
        start(input={"n": i})
    assert count() == one
