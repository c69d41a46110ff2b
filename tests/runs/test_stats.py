"""The operations page's figures (runs/stats.py) against a history with known figures, on
SQLite and PostgreSQL; the rollup kept by the sweep; and, on PostgreSQL, the plans: every
query is served by an index, never by a sequential scan of a big table."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.models import FailureHour, Run, RunHour, StatsRollup
from runs.services import sweep_all
from runs.stats import (
    ROLLUP_EVERY,
    WINDOWS,
    bucket_start,
    operations_stats,
    percentile,
    stats_rollup,
)
from tests.conftest import on_postgres
from tests.runs.stats_history import (
    ALPHA,
    ANSWER_BY_AGENT,
    ANSWER_BY_GROUP,
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


def test_it_counts_the_state_now() -> None:
    now = seed_history()
    stats = operations_stats(window="24h")
    assert {(r["agent"], r["kind"]): r["count"] for r in stats["open_requests"]} == OPEN
    oldest = {r["agent"]: r["oldest_at"] for r in stats["open_requests"]}
    assert abs((now - oldest[BETA]) - dt.timedelta(hours=2)) < dt.timedelta(seconds=5)
    assert abs((now - oldest[ALPHA]) - dt.timedelta(minutes=50)) < dt.timedelta(seconds=5)
    assert stats["workers"] == {"alive": 1, "stale": 0, "gone": 1}


def test_it_counts_the_last_24_hours() -> None:
    seed_history()
    stats = operations_stats(window="24h")
    series = stats["runs_over_time"]
    assert series["bucket"] == "hour" and len(series["buckets"]) == 24
    assert series["totals"] == RUNS_24H
    assert sum(b["total"] for b in series["buckets"]) == sum(RUNS_24H.values())
    assert {r["agent"]: (r["cost"], r["runs"]) for r in stats["cost_by_agent"]} == COST_24H
    assert {r["error_class"]: r["attempts"] for r in stats["failures"]["by_class"]} == FAILURES_24H
    top = stats["failures"]["top_fingerprints"][0]
    assert (top["fingerprint"], top["attempts"], top["agent"]) == ("fpA", 2, ALPHA)
    assert top["message"] == "upstream <b>slow</b>"
    assert stats["lease_losses"] == {"total": 1, "by_agent": [{"agent": ALPHA, "count": 1}]}
    assert stats["request_outcomes"] == OUTCOMES_24H
    times = stats["answer_times"]
    assert _figures(times["agent"]) == ANSWER_BY_AGENT
    assert _figures(times["group"]) == ANSWER_BY_GROUP


def _figures(rows: list[dict]) -> dict[str, tuple[int, float, float]]:
    return {r["key"]: (r["count"], round(r["p50"], 3), round(r["p95"], 3)) for r in rows}


def test_the_week_holds_what_the_day_does_not() -> None:
    seed_history()
    stats = operations_stats(window="7d")
    series = stats["runs_over_time"]
    assert series["bucket"] == "day" and len(series["buckets"]) == 7
    assert series["totals"] == RUNS_7D
    # The answer of two days ago counts in the week, not in the day.
    assert stats["request_outcomes"]["answered"] == OUTCOMES_24H["answered"] + 1
    # The run of ten days ago (cost 9) counts nowhere.
    assert sum(r["cost"] for r in stats["cost_by_agent"]) == Decimal("3.75")


def test_a_window_is_whole_hours_or_whole_days() -> None:
    now = dt.datetime(2026, 12, 5, 10, 37, 12, tzinfo=dt.UTC)
    assert WINDOWS["24h"].start(now) == dt.datetime(2026, 12, 4, 11, tzinfo=dt.UTC)
    assert WINDOWS["7d"].start(now) == dt.datetime(2026, 11, 29, tzinfo=dt.UTC)
    assert bucket_start(now, dt.timedelta(hours=1)) == dt.datetime(2026, 12, 5, 10, tzinfo=dt.UTC)


def test_percentile_is_postgresqls_percentile_cont() -> None:
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.95) == 7.0
    assert percentile([300.0, 120.0, 600.0], 0.95) == pytest.approx(570.0)
    assert percentile([60.0, 180.0], 0.5) == 120.0


# --- The rollup -------------------------------------------------------------------------


def test_the_rollup_counts_what_finished_since_and_not_twice() -> None:
    seed_history(rollup=False)
    assert operations_stats(window="24h")["runs_over_time"]["totals"] == {}
    assert stats_rollup(force=True) > 0
    first = sorted(RunHour.objects.values_list("hour", "agent", "status", "runs"))
    # Again at once: another sweeper's round is skipped (at most once a minute).
    assert stats_rollup() == 0
    # Forced again: the open hours are recomputed, not added to.
    stats_rollup(force=True)
    assert sorted(RunHour.objects.values_list("hour", "agent", "status", "runs")) == first
    assert operations_stats(window="24h")["runs_over_time"]["totals"] == RUNS_24H


def test_the_sweep_keeps_the_rollup_and_picks_up_new_outcomes() -> None:
    seed_history(rollup=False)
    report = sweep_all()
    assert report.other["stats"] > 0
    rolled = StatsRollup.objects.get().rolled_at
    run = Run.objects.create(agent=ALPHA, status="succeeded", cost=Decimal("1"))
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now())
    # Within the minute the rollup is not redone; a minute later it is.
    assert sweep_all().other["stats"] == 0
    stats_rollup(now=rolled + ROLLUP_EVERY + dt.timedelta(seconds=1))
    totals = operations_stats(window="24h")["runs_over_time"]["totals"]
    assert totals["succeeded"] == RUNS_24H["succeeded"] + 1


def test_the_rollup_forgets_what_is_older_than_it_keeps() -> None:
    seed_history()
    old = timezone.now() - dt.timedelta(days=9)
    RunHour.objects.create(hour=old, agent=ALPHA, status="succeeded", runs=1)
    FailureHour.objects.create(hour=old, agent=ALPHA, error_class="transient", attempts=1)
    stats_rollup(force=True)
    assert not RunHour.objects.filter(hour__lt=old + dt.timedelta(hours=1)).exists()
    assert not FailureHour.objects.filter(hour__lt=old + dt.timedelta(hours=1)).exists()


# --- The plans --------------------------------------------------------------------------

BIG_TABLES = ("runs_run", "runs_attempt", "runs_inputrequest", "runs_runevent")


def _plans(queries: list[dict[str, str]]) -> list[tuple[str, str]]:
    plans = []
    with connection.cursor() as cursor:
        # A tiny table is read sequentially whatever its indexes: forbid that, and a
        # sequential scan left in a plan means no index can serve the query.
        cursor.execute("SET LOCAL enable_seqscan = off")
        for query in queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute("EXPLAIN " + sql)
            plans.append((sql, "\n".join(row[0] for row in cursor.fetchall())))
    return plans


# Partial indexes hold only what the query counts: reading one whole is the intent.
PARTIAL = {
    "request_pending_expiry_idx",
    "request_pending_kind_idx",
    "request_expired_closed_idx",
    "attempt_lost_idx",
    "attempt_error_ended_idx",
}
SCAN = re.compile(
    r"^(\s*)(?:->\s*)?(?:Index|Index Only|Bitmap Index) Scan (?:Backward )?(?:using|on) (\w+)(?: on (\w+))?"
)


def _whole_index_reads(plan: str) -> list[str]:
    """Index scans of a big table without a condition: with sequential scans off, that is
    how a plan that would hash a whole table (a join the planner could not serve by the
    key) shows itself."""
    lines = plan.splitlines()
    found = []
    for i, line in enumerate(lines):
        match = SCAN.match(line)
        if not match or match.group(2) in PARTIAL:
            continue
        table = match.group(3) or ""
        if table and not table.startswith(BIG_TABLES):
            continue
        if not table and not match.group(2).startswith(("runs_run", "runs_attempt", "runs_input")):
            continue
        depth = len(match.group(1))
        body = []
        for following in lines[i + 1 :]:
            if len(following) - len(following.lstrip()) <= depth or "->" in following:
                break
            body.append(following)
        if not any("Index Cond" in b for b in body):
            found.append(line)
    return found


@pytest.mark.postgres
def test_every_query_of_the_page_and_the_rollup_is_served_by_an_index() -> None:
    seed_history(rollup=False)
    with CaptureQueriesContext(connection) as rollup:
        stats_rollup(force=True)
    with CaptureQueriesContext(connection) as page:
        operations_stats(window="7d")
    assert on_postgres()
    plans = _plans(list(rollup.captured_queries) + list(page.captured_queries))
    text = "\n".join(plan for _sql, plan in plans)
    for sql, plan in plans:
        for table in BIG_TABLES:
            assert not re.search(rf"Seq Scan on {table}\b", plan), (sql, plan)
        assert not _whole_index_reads(plan), (sql, plan)
    for index in (
        "run_finished_idx",  # the rollup of finished runs
        "attempt_error_ended_idx",  # the rollup of failed attempts
        "request_status_answered_idx",  # time to answer, shares
        "request_expired_closed_idx",  # the expired share
        "attempt_lost_idx",  # lease losses
        "runhour_hour_idx",  # runs over time, cost
        "failurehour_hour_idx",  # failures
    ):
        assert index in text, (index, text)
    # The open requests: a partial index of the pending ones, whichever the planner takes.
    assert re.search(r"request_pending_(kind|expiry)_idx", text), text


def test_the_plan_check_sees_a_whole_index_read() -> None:
    hashed = """Hash Join
  Hash Cond: ((runs_run.id)::text = (runs_inputrequest.run_id)::text)
  ->  Index Scan using runs_run_pkey on runs_run
  ->  Hash
        ->  Index Scan using request_pending_kind_idx on runs_inputrequest"""
    looked_up = """Nested Loop
  ->  Index Scan using request_pending_kind_idx on runs_inputrequest
  ->  Index Scan using runs_run_pkey on runs_run
        Index Cond: ((id)::text = (runs_inputrequest.run_id)::text)"""
    assert _whole_index_reads(hashed) == ["  ->  Index Scan using runs_run_pkey on runs_run"]
    assert _whole_index_reads(looked_up) == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_sweepers_roll_up_once() -> None:
    from tests.runs.test_races import race

    seed_history(rollup=False)
    for _ in range(5):
        StatsRollup.objects.update(rolled_at=timezone.now() - dt.timedelta(hours=1))
        results = race(stats_rollup, stats_rollup)
        # One took the row and did the work; the other skipped it (locked, or just done).
        assert sorted(int(r) for r in results)[0] == 0, results
        assert sorted(int(r) for r in results)[1] > 0, results
        totals = operations_stats(window="24h")["runs_over_time"]["totals"]
        assert totals == RUNS_24H
