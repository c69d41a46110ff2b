"""Prometheus metrics. Counters live in each process (Prometheus scrapes every process);
gauges about runs and requests are read from the database at scrape time, so every
process reports the same truth for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import Count, Min
from django.utils import timezone
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

STALE_WRITES = Counter(
    "holdpoint_stale_writes_rejected_total",
    "Worker writes refused by the fence, by reason.",
    ["reason"],
)
LEASE_EXPIRIES = Counter(
    "holdpoint_lease_expiries_total", "Attempts marked lost because their lease ran out."
)
CONTROL_OPERATIONS = Counter(
    "holdpoint_control_operations_total",
    "Control operations by type and outcome (ok, or the error code).",
    ["operation", "outcome"],
)
CONTROL_LATENCY = Histogram(
    "holdpoint_control_operation_seconds",
    "Time a control operation's service call takes, commit included.",
    ["operation"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
OPEN_WEBSOCKETS = Gauge("holdpoint_open_websockets", "Websockets open in this process.")


class DatabaseCollector(Collector):
    """Runs by status, pending requests and the age of the oldest, read at scrape time."""

    def collect(self) -> Iterator[Any]:
        from runs.models import AgentGate, InputRequest, Run
        from runs.states import RequestStatus, RunStatus

        by_status = GaugeMetricFamily("holdpoint_runs", "Runs by status.", labels=["status"])
        counts = dict(Run.objects.values_list("status").annotate(n=Count("id")).order_by())
        for status in RunStatus.values:
            by_status.add_metric([status], counts.get(status, 0))
        yield by_status
        yield GaugeMetricFamily(
            "holdpoint_paused_runs",
            "Runs paused or pausing (someone outside the run asked it to stop for a while).",
            value=counts.get(RunStatus.PAUSED, 0) + counts.get(RunStatus.PAUSE_REQUESTED, 0),
        )
        yield GaugeMetricFamily(
            "holdpoint_paused_agents",
            "Agents whose gate is closed (the kill switch): none of their runs is claimed.",
            value=AgentGate.objects.filter(paused=True).count(),
        )
        pending = InputRequest.objects.filter(status=RequestStatus.PENDING).aggregate(
            n=Count("id"), oldest=Min("created_at")
        )
        yield GaugeMetricFamily(
            "holdpoint_pending_requests", "Input requests waiting for a person.", value=pending["n"]
        )
        age = (timezone.now() - pending["oldest"]).total_seconds() if pending["oldest"] else 0.0
        yield GaugeMetricFamily(
            "holdpoint_oldest_pending_request_seconds",
            "Age of the oldest pending input request.",
            value=age,
        )


_registered = False


def register_database_collector() -> None:
    global _registered
    if not _registered:
        REGISTRY.register(DatabaseCollector())
        _registered = True
