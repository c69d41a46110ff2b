"""``GET /api/workers``: every worker, in process and remote, as the Workers page shows it.

The same read as the page (``runs.workers.workers_overview``): name, client and version,
host and pid, agents, concurrency, last contact, state (alive, stale, gone), the attempts
it runs now and its lease losses of the last 24 hours. Needs ``runs.view_worker``
(operators and admins); throttled like every endpoint (``api/throttles.py``).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.base import AUTH_CODES, problems, require_perm
from api.serializers import utc
from runs.db import db_now
from runs.selectors import VIEW_WORKERS
from runs.workers import workers_overview


class WorkerAttemptSerializer(serializers.Serializer):
    attempt_id = serializers.CharField()
    run_id = serializers.CharField()
    agent = serializers.CharField()
    number = serializers.IntegerField()
    started_at = serializers.CharField(allow_null=True)
    lease_expires_at = serializers.CharField(allow_null=True)
    ended_at = serializers.CharField(allow_null=True)


class WorkerSerializer(serializers.Serializer):
    name = serializers.CharField()
    # Text, not an enum: drf-spectacular would name its enum after "kind", as it does the
    # requests' kinds.
    kind = serializers.CharField(help_text="process (runagents, serve) or remote.")
    token = serializers.CharField(help_text="The worker token it calls with ('' in process).")
    client = serializers.CharField()
    client_version = serializers.CharField()
    host = serializers.CharField()
    pid = serializers.IntegerField(allow_null=True)
    agents = serializers.ListField(child=serializers.CharField())
    concurrency = serializers.IntegerField()
    lease_seconds = serializers.FloatField()
    state = serializers.ChoiceField(
        choices=["alive", "stale", "gone"],
        help_text="alive until its lease (or claim wait) passes without contact, then stale, "
        "gone after three times that or when it said it stopped.",
    )
    first_seen_at = serializers.CharField()
    since = serializers.CharField(help_text="Since when it is this process, without a break.")
    last_seen_at = serializers.CharField(help_text="Its last contact (recorded every few seconds).")
    stopped_at = serializers.CharField(allow_null=True)
    running = WorkerAttemptSerializer(many=True, help_text="The attempts it holds now.")
    lease_losses = WorkerAttemptSerializer(many=True, help_text="The latest, newest first.")
    lease_losses_24h = serializers.IntegerField()


def _attempt(row: dict[str, Any]) -> dict[str, Any]:
    return {
        **row,
        "started_at": utc(row["started_at"]),
        "lease_expires_at": utc(row["lease_expires_at"]),
        "ended_at": utc(row["ended_at"]),
    }


def worker_data(row: dict[str, Any]) -> dict[str, Any]:
    worker = row["worker"]
    return {
        "name": worker.name,
        "kind": worker.kind,
        "token": row["token"],
        "client": worker.client,
        "client_version": worker.client_version,
        "host": worker.host,
        "pid": worker.pid,
        "agents": list(worker.agents),
        "concurrency": worker.concurrency,
        "lease_seconds": worker.lease_seconds,
        "state": row["state"],
        "first_seen_at": utc(worker.first_seen_at),
        "since": utc(worker.since),
        "last_seen_at": utc(worker.last_seen_at),
        "stopped_at": utc(worker.stopped_at),
        "running": [_attempt(a) for a in row["running"]],
        "lease_losses": [_attempt(a) for a in row["losses"]],
        "lease_losses_24h": row["loss_count"],
    }


@extend_schema(
    tags=["workers"],
    responses={200: WorkerSerializer(many=True), **problems(*AUTH_CODES)},
)
class WorkerListApi(APIView):
    """Every worker, newest contact first (at most 200): who it is, whether it is alive,
    what it runs now and its recent lease losses."""

    def get(self, request: Request) -> Response:
        require_perm(request.user, VIEW_WORKERS)
        return Response([worker_data(row) for row in workers_overview(db_now())])
