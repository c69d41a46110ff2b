"""The operations page's figures (``/operations/``, ``GET /api/stats/operations``): the
state now, and the last 24 hours or 7 days. The one home of every figure; the page and the
API call ``operations_stats``.

Two kinds of reads, each chosen so that it stays fast at a million runs and ten million
events (docs/performance.md, the growth benchmark; EXPLAIN in tests/runs/test_stats.py):

- **Rollups** for what would otherwise read every run of the window: finished runs by
  outcome, their cost, and failed attempts by class and fingerprint. ``stats_rollup`` (a
  sweep, at most once a minute across all sweepers) recomputes the open hours into
  ``RunHour`` and ``FailureHour`` from ``Run`` and ``Attempt`` through partial indexes;
  the page reads at most 7 by 24 hours of rows per agent and outcome. These figures are as
  of the last rollup (``rolled_at``, shown on the page).
- **Live queries** for what is small by nature, each through a partial index: the open
  requests (pending), answered and expired requests of the window, lease losses, workers.

A window is whole hours (24 h: this hour and the 23 before) or whole days in UTC (7 d:
today and the 6 days before), so that its totals and its bars count the same things.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Max, Min, OuterRef, Q, Subquery, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone

from runs.db import postgresql
from runs.models import (
    Attempt,
    FailureHour,
    InputRequest,
    Run,
    RunHour,
    StatsRollup,
    Worker,
)
from runs.states import AttemptStatus, RequestKind, RequestStatus
from runs.workers import MAX_LISTED, state_at

UTC = dt.UTC


@dataclass(frozen=True)
class Window:
    name: str
    buckets: int
    bucket: dt.timedelta

    def start(self, now: dt.datetime) -> dt.datetime:
        """The first bucket's start: whole hours (or whole UTC days) ending with ``now``'s."""
        return bucket_start(now, self.bucket) - (self.buckets - 1) * self.bucket


HOUR = dt.timedelta(hours=1)
DAY = dt.timedelta(days=1)
WINDOWS = {"24h": Window("24h", 24, HOUR), "7d": Window("7d", 7, DAY)}
DEFAULT_WINDOW = "24h"
# The kinds a person answers (a pause's "answer" is continuing it: not a hold point's).
ANSWERED_KINDS = [RequestKind.INPUT_REQUIRED, RequestKind.AUTH_REQUIRED]
# Outcomes drawn as bars, in this order.
OUTCOMES = ["succeeded", "failed", "cancelled"]
TOP_FINGERPRINTS = 10
MAX_ROWS = 50

# The rollup: at most once this often (every worker sweeps, and the sweep is frequent);
# it recomputes from the hour before the last rollup (minus ``ROLLUP_MARGIN``, for a
# transaction that committed late), and keeps ``ROLLUP_KEEP`` of hours.
ROLLUP_EVERY = dt.timedelta(seconds=60)
ROLLUP_MARGIN = dt.timedelta(minutes=5)
ROLLUP_KEEP = dt.timedelta(days=8)
ROLLUP_NAME = "hours"


def bucket_start(when: dt.datetime, bucket: dt.timedelta) -> dt.datetime:
    when = when.astimezone(UTC)
    if bucket >= DAY:
        return when.replace(hour=0, minute=0, second=0, microsecond=0)
    return when.replace(minute=0, second=0, microsecond=0)


# --- The rollup (a sweep) ---------------------------------------------------------------


def stats_rollup(*, limit: int = 100, now: dt.datetime | None = None, force: bool = False) -> int:
    """Recompute the open hours of ``RunHour`` and ``FailureHour``; return the rows written
    (0 when another sweeper holds the rollup, or it ran less than ``ROLLUP_EVERY`` ago).
    ``limit`` is the sweeps' argument; a rollup is one piece of work whatever it is."""
    now = now or timezone.now()
    StatsRollup.objects.get_or_create(
        name=ROLLUP_NAME, defaults={"rolled_at": now - ROLLUP_KEEP - ROLLUP_EVERY}
    )
    with transaction.atomic(durable=True):
        # SKIP LOCKED: a sweeper that finds the row taken leaves this round to its holder.
        state = (
            StatsRollup.objects.select_for_update(skip_locked=True).filter(name=ROLLUP_NAME).first()
        )
        if state is None or (not force and state.rolled_at > now - ROLLUP_EVERY):
            return 0
        start = bucket_start(max(state.rolled_at, now - ROLLUP_KEEP) - ROLLUP_MARGIN, HOUR)
        RunHour.objects.filter(Q(hour__gte=start) | Q(hour__lt=now - ROLLUP_KEEP)).delete()
        FailureHour.objects.filter(Q(hour__gte=start) | Q(hour__lt=now - ROLLUP_KEEP)).delete()
        # run_finished_idx serves this: finished_at >= start.
        runs = (
            Run.objects.filter(finished_at__gte=start)
            .annotate(hour=TruncHour("finished_at", tzinfo=UTC))
            .values("hour", "agent", "status", "failure_class")
            .annotate(n=Count("id"), total=Sum("cost"))
            .order_by()
        )
        run_rows = [
            RunHour(
                hour=row["hour"],
                agent=row["agent"],
                status=row["status"],
                failure_class=row["failure_class"],
                runs=row["n"],
                cost=row["total"] or Decimal("0"),
            )
            for row in runs
        ]
        # attempt_error_ended_idx serves this: error_class <> '' AND ended_at >= start.
        failures = (
            Attempt.objects.filter(ended_at__gte=start)
            .exclude(error_class="")
            .annotate(hour=TruncHour("ended_at", tzinfo=UTC), agent=agent_of_run())
            .values("hour", "agent", "error_class", "error_fingerprint")
            .annotate(n=Count("id"), error_type=Max("error_type"), message=Max("error_message"))
            .order_by()
        )
        failure_rows = [
            FailureHour(
                hour=row["hour"],
                agent=row["agent"],
                error_class=row["error_class"],
                fingerprint=row["error_fingerprint"],
                error_type=(row["error_type"] or "")[:200],
                message=(row["message"] or "")[:200],
                attempts=row["n"],
            )
            for row in failures
        ]
        RunHour.objects.bulk_create(run_rows, batch_size=1000)
        FailureHour.objects.bulk_create(failure_rows, batch_size=1000)
        state.rolled_at = now
        state.save(update_fields=["rolled_at"])
    return len(run_rows) + len(failure_rows)


# --- The figures ------------------------------------------------------------------------


def open_requests() -> list[dict[str, Any]]:
    """Pending requests by agent and kind, with the oldest one's time (request_pending_*
    partial indexes: the rows grow with what is pending, not with every request)."""
    rows = (
        InputRequest.objects.filter(status=RequestStatus.PENDING)
        .annotate(agent=agent_of_run())
        .values("agent", "kind")
        .annotate(n=Count("id"), oldest=Min("created_at"))
        .order_by("-n", "agent", "kind")[:MAX_ROWS]
    )
    return [
        {"agent": r["agent"], "kind": r["kind"], "count": r["n"], "oldest_at": r["oldest"]}
        for r in rows
    ]


def agent_of_run(column: str = "run_id") -> Subquery:
    """The agent of the row's run, as a scalar subquery: one primary-key lookup per row of
    the (small) set being counted. A join would let the planner hash the whole runs table
    instead (a sequential scan of a million runs to count ten thousand requests)."""
    return Subquery(Run.objects.filter(pk=OuterRef(column)).values("agent")[:1])


def percentile(values: list[float], fraction: float) -> float | None:
    """Linear interpolation between the closest ranks: PostgreSQL's ``percentile_cont``."""
    if not values:
        return None
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _answer_time_sql(group: str) -> str:
    request, run = InputRequest._meta.db_table, Run._meta.db_table
    if group == "agent":
        # A scalar subquery, not a join: see ``agent_of_run``.
        key, source = f'(SELECT r.agent FROM "{run}" r WHERE r.id = q.run_id)', ""  # noqa: S608 - names from the models
    else:
        # Each group of the request's policy; a question asked of anyone counts under ''.
        key = "coalesce(g.name, '')"
        source = (
            "LEFT JOIN LATERAL jsonb_array_elements_text(CASE WHEN jsonb_typeof("
            "q.policy->'groups') = 'array' THEN q.policy->'groups' ELSE '[]'::jsonb END)"
            " AS g(name) ON true"
        )
    seconds = "extract(epoch FROM q.answered_at - q.created_at)"
    return (
        f"SELECT {key}, count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY {seconds}), "  # noqa: S608 - names from the models; values are parameters
        f"percentile_cont(0.95) WITHIN GROUP (ORDER BY {seconds}) "
        f'FROM "{request}" q {source} '
        "WHERE q.status = %s AND q.answered_at >= %s AND q.kind IN (%s, %s) "
        f"GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT {MAX_ROWS}"
    )


def answer_times(since: dt.datetime) -> dict[str, list[dict[str, Any]]]:
    """Seconds from asking to answering (p50, p95) of the requests answered since
    ``since``, by agent and by approver group (request_status_answered_idx)."""
    params: list[Any] = [RequestStatus.ANSWERED, since, *[str(k) for k in ANSWERED_KINDS]]
    result: dict[str, list[dict[str, Any]]] = {}
    if postgresql():
        for group in ("agent", "group"):
            with connection.cursor() as cursor:
                cursor.execute(_answer_time_sql(group), params)
                result[group] = [
                    {"key": key, "count": n, "p50": float(p50), "p95": float(p95)}
                    for key, n, p50, p95 in cursor.fetchall()
                ]
        return result
    # SQLite has no percentile aggregate: the same figures from the same rows, here.
    rows = InputRequest.objects.filter(
        status=RequestStatus.ANSWERED, answered_at__gte=since, kind__in=ANSWERED_KINDS
    ).values_list("run__agent", "policy", "created_at", "answered_at")
    by: dict[str, dict[str, list[float]]] = {"agent": defaultdict(list), "group": defaultdict(list)}
    for agent, policy, created, answered in rows:
        if answered is None:
            continue
        seconds = (answered - created).total_seconds()
        by["agent"][agent].append(seconds)
        groups = policy.get("groups") if isinstance(policy, dict) else None
        for name in groups if isinstance(groups, list) and groups else [""]:
            by["group"][str(name)].append(seconds)
    for group, values in by.items():
        entries: list[dict[str, Any]] = [
            {
                "key": key,
                "count": len(v),
                "p50": percentile(v, 0.5),
                "p95": percentile(v, 0.95),
            }
            for key, v in values.items()
        ]
        entries.sort(key=lambda e: (-int(e["count"]), str(e["key"])))
        result[group] = entries[:MAX_ROWS]
    return result


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def request_outcomes(since: dt.datetime) -> dict[str, Any]:
    """How the questions and approvals closed since ``since``: answered or expired, and of
    the approvals decided, denied and sent back (``respond``), as counts and shares."""
    # request_status_answered_idx serves this: status = 'answered' AND answered_at >= since.
    decided = (
        InputRequest.objects.filter(
            status=RequestStatus.ANSWERED, answered_at__gte=since, kind__in=ANSWERED_KINDS
        )
        .values("kind", "answer__decision")
        .annotate(n=Count("id"))
        .order_by()
    )
    answered = approvals = denied = sent_back = 0
    for row in decided:
        answered += row["n"]
        if row["kind"] == RequestKind.AUTH_REQUIRED:
            approvals += row["n"]
            denied += row["n"] if row["answer__decision"] == "deny" else 0
            sent_back += row["n"] if row["answer__decision"] == "respond" else 0
    # request_expired_closed_idx serves this.
    expired = InputRequest.objects.filter(
        status=RequestStatus.EXPIRED, closed_at__gte=since, kind__in=ANSWERED_KINDS
    ).count()
    return {
        "answered": answered,
        "expired": expired,
        "expired_share": _share(expired, answered + expired),
        "approvals_decided": approvals,
        "denied": denied,
        "denied_share": _share(denied, approvals),
        "sent_back": sent_back,
        "sent_back_share": _share(sent_back, approvals),
    }


def runs_over_time(window: Window, since: dt.datetime) -> dict[str, Any]:
    """Finished runs per bucket and outcome, from the rollup (runhour_hour_idx)."""
    counts: dict[dt.datetime, dict[str, int]] = {
        since + i * window.bucket: {} for i in range(window.buckets)
    }
    totals: dict[str, int] = {}
    rows = (
        RunHour.objects.filter(hour__gte=since)
        .values("hour", "status")
        .annotate(n=Sum("runs"))
        .order_by()
    )
    for row in rows:
        bucket = bucket_start(row["hour"], window.bucket)
        if bucket in counts:
            counts[bucket][row["status"]] = counts[bucket].get(row["status"], 0) + row["n"]
            totals[row["status"]] = totals.get(row["status"], 0) + row["n"]
    return {
        "bucket": "hour" if window.bucket == HOUR else "day",
        "buckets": [
            {"start": start, "total": sum(c.values()), "counts": c} for start, c in counts.items()
        ],
        "totals": totals,
    }


def failures(since: dt.datetime) -> dict[str, Any]:
    """Failed attempts by class, and the most frequent fingerprints, from the rollup."""
    base = FailureHour.objects.filter(hour__gte=since)
    by_class = base.values("error_class").annotate(n=Sum("attempts")).order_by("-n", "error_class")
    top = (
        base.values("fingerprint", "error_class", "agent")
        .annotate(n=Sum("attempts"), error_type=Max("error_type"), message=Max("message"))
        .order_by("-n", "fingerprint")[:TOP_FINGERPRINTS]
    )
    return {
        "by_class": [{"error_class": r["error_class"], "attempts": r["n"]} for r in by_class],
        "top_fingerprints": [
            {
                "fingerprint": r["fingerprint"],
                "error_class": r["error_class"],
                "agent": r["agent"],
                "error_type": r["error_type"],
                "message": r["message"],
                "attempts": r["n"],
            }
            for r in top
        ],
    }


def lease_losses(since: dt.datetime) -> dict[str, Any]:
    """Attempts whose lease ran out since ``since``, by agent (attempt_lost_idx)."""
    rows = (
        Attempt.objects.filter(status=AttemptStatus.LOST, ended_at__gte=since)
        .annotate(agent=agent_of_run())
        .values("agent")
        .annotate(n=Count("id"))
        .order_by("-n", "agent")[:MAX_ROWS]
    )
    by_agent = [{"agent": r["agent"], "count": r["n"]} for r in rows]
    return {"total": sum(r["count"] for r in by_agent), "by_agent": by_agent}


def workers_alive(now: dt.datetime) -> dict[str, int]:
    """Workers by state now, by the Workers page's rule (``runs.workers.state_at``)."""
    counts = {state: 0 for state in Worker.State.values}
    fields = ("stale_at", "gone_at", "stopped_at")
    for worker in Worker.objects.order_by("-last_seen_at", "pk").only(*fields)[:MAX_LISTED]:
        counts[state_at(worker, now)] += 1
    return counts


def cost_by_agent(since: dt.datetime) -> list[dict[str, Any]]:
    """The cost of the runs finished in the window, by agent (the rollup)."""
    rows = (
        RunHour.objects.filter(hour__gte=since)
        .values("agent")
        .annotate(total=Sum("cost"), n=Sum("runs"))
        .order_by("-total", "agent")[:MAX_ROWS]
    )
    return [{"agent": r["agent"], "cost": r["total"], "runs": r["n"]} for r in rows]


def operations_stats(*, window: str = DEFAULT_WINDOW, now: dt.datetime | None = None) -> dict:
    """Every figure of the operations page for ``window`` (a key of ``WINDOWS``)."""
    now = now or timezone.now()
    chosen = WINDOWS[window]
    since = chosen.start(now)
    state = StatsRollup.objects.filter(name=ROLLUP_NAME).values_list("rolled_at", flat=True)
    return {
        "window": chosen.name,
        "since": since,
        "now": now,
        "rolled_at": next(iter(state), None),
        "open_requests": open_requests(),
        "answer_times": answer_times(since),
        "request_outcomes": request_outcomes(since),
        "runs_over_time": runs_over_time(chosen, since),
        "failures": failures(since),
        "lease_losses": lease_losses(since),
        "workers": workers_alive(now),
        "cost_by_agent": cost_by_agent(since),
    }
