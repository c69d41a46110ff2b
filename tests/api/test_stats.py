"""``GET /api/stats/operations`` (api/stats.py): the operations page's figures as JSON, for
operators and admins only, throttled, and a bad window is a problem that reads nothing."""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runs.models import FailureHour, RunHour, StatsRollup
from tests.api.conftest import client_for
from tests.runs.stats_history import (
    ALPHA,
    BETA,
    COST_24H,
    FAILURES_24H,
    OPEN,
    OUTCOMES_24H,
    RUNS_7D,
    RUNS_24H,
    seed_history,
)

pytestmark = pytest.mark.django_db

URL = "/api/stats/operations"
PROBLEM = "application/problem+json"


def problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["code"] == code, body
    return body


def test_it_serves_the_figures_of_the_day(operator: User) -> None:
    seed_history()
    response = client_for(operator).get(URL)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["window"] == "24h"
    assert body["since"].endswith(":00:00Z") and body["rolled_at"].endswith("Z")
    assert {(r["agent"], r["kind"]): r["count"] for r in body["open_requests"]} == OPEN
    assert body["runs_over_time"]["totals"] == RUNS_24H
    assert len(body["runs_over_time"]["buckets"]) == 24
    costs = {r["agent"]: (Decimal(r["cost"]), r["runs"]) for r in body["cost_by_agent"]}
    assert costs == COST_24H
    assert {r["error_class"]: r["attempts"] for r in body["failures"]["by_class"]} == FAILURES_24H
    assert body["request_outcomes"] == OUTCOMES_24H
    assert body["lease_losses"]["total"] == 1
    assert body["workers"] == {"alive": 1, "stale": 0, "gone": 1}
    beta = next(r for r in body["answer_times"]["agent"] if r["key"] == BETA)
    assert (beta["count"], beta["p50"], round(beta["p95"], 3)) == (3, 300.0, 570.0)


def test_it_serves_the_week(operator: User) -> None:
    seed_history()
    body = client_for(operator).get(URL, {"window": "7d"}).json()
    assert body["window"] == "7d"
    assert body["runs_over_time"]["bucket"] == "day"
    assert body["runs_over_time"]["totals"] == RUNS_7D
    assert body["since"].endswith("T00:00:00Z")


def test_admins_may_read_it_and_nobody_else(
    admin_user: User, approver: User, viewer: User, outsider: User
) -> None:
    assert client_for(admin_user).get(URL).status_code == 200
    for person in (approver, viewer, outsider):
        body = problem(client_for(person).get(URL), 403, "permission_denied")
        assert "operators and admins" in body["detail"]
    problem(client_for(None).get(URL), 401, "not_authenticated")


def test_it_answers_only_get(operator: User) -> None:
    response = client_for(operator).post(URL, {}, format="json")
    assert response.status_code == 405
    assert response["Content-Type"] == PROBLEM


@pytest.mark.parametrize("window", ["1h", "24H", "7d ", "30d"])
def test_an_unknown_window_is_a_problem_that_reads_nothing(operator: User, window: str) -> None:
    seed_history()
    before = (RunHour.objects.count(), FailureHour.objects.count(), StatsRollup.objects.get())
    client = client_for(operator)
    with CaptureQueriesContext(connection) as queries:
        body = problem(client.get(URL, {"window": window}), 422, "invalid_input")
    assert [e["pointer"] for e in body["errors"]] == ["/window"]
    # Refused before any figure was read, and nothing changed.
    assert not any("runs_run" in q["sql"] or "runs_runhour" in q["sql"] for q in queries)
    after = (RunHour.objects.count(), FailureHour.objects.count(), StatsRollup.objects.get())
    assert after == before and after[2].rolled_at == before[2].rolled_at


def test_it_is_throttled_like_every_read(operator: User, settings: Any) -> None:
    settings.HOLDPOINT_THROTTLE_USER = "2/min"
    client = client_for(operator)
    assert client.get(URL).status_code == 200
    assert client.get(URL, {"window": "7d"}).status_code == 200
    body = problem(client.get(URL), 429, "throttled")
    assert body["retry_after"] > 0


def test_untrusted_names_come_back_as_they_were_given(operator: User) -> None:
    seed_history()
    body = client_for(operator).get(URL).json()
    agents = {r["agent"] for r in body["cost_by_agent"]}
    assert agents == {ALPHA, BETA}
    top = body["failures"]["top_fingerprints"][0]
    assert top["message"] == "upstream <b>slow</b>"


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    query=st.lists(
        st.tuples(
            st.sampled_from(["window", "x", "format"]),
            st.one_of(st.text(max_size=20), st.sampled_from(["24h", "7d", "json", "api"])),
        ),
        max_size=4,
    )
)
def test_random_queries_never_break_it(operator: User, query: list[tuple[str, str]]) -> None:
    response = client_for(operator).get(URL + "?" + urlencode(query))
    assert response.status_code in (200, 400, 404, 422), response.content
    if response.status_code == 200:
        assert response.json()["window"] in ("24h", "7d")
    else:
        assert response["Content-Type"] == PROBLEM
