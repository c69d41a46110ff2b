"""``GET /api/stats/operations``: the operations page's figures as JSON (``runs.stats``).

Needs ``runs.view_worker`` (operators and admins, as the page); throttled like every
endpoint (``api/throttles.py``). ``?window=24h`` (default) or ``7d``; anything else is a
problem (422, ``invalid_input`` on ``/window``) and reads nothing.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.base import AUTH_CODES, problems, require_perm
from api.reads import QueryValidated
from api.serializers import utc
from runs.selectors import VIEW_OPERATIONS
from runs.stats import DEFAULT_WINDOW, WINDOWS, operations_stats


class StatsOpenRequestSerializer(serializers.Serializer):
    agent = serializers.CharField()
    kind = serializers.CharField(help_text="input_required, auth_required or pause.")
    count = serializers.IntegerField()
    oldest_at = serializers.CharField(help_text="When the oldest of them was asked.")


class StatsAnswerTimeSerializer(serializers.Serializer):
    key = serializers.CharField(
        help_text="The agent, or the approver group ('' for a question anyone may answer)."
    )
    count = serializers.IntegerField()
    p50 = serializers.FloatField(help_text="Seconds from asking to the answer.")
    p95 = serializers.FloatField()


class StatsAnswerTimesSerializer(serializers.Serializer):
    agent = StatsAnswerTimeSerializer(many=True)
    group = StatsAnswerTimeSerializer(many=True)


class StatsRequestOutcomesSerializer(serializers.Serializer):
    answered = serializers.IntegerField()
    expired = serializers.IntegerField()
    expired_share = serializers.FloatField(
        allow_null=True, help_text="Of the questions and approvals closed (answered + expired)."
    )
    approvals_decided = serializers.IntegerField()
    denied = serializers.IntegerField()
    denied_share = serializers.FloatField(allow_null=True, help_text="Of the approvals decided.")
    sent_back = serializers.IntegerField(help_text="Approvals answered with `respond`.")
    sent_back_share = serializers.FloatField(allow_null=True)


class StatsBucketSerializer(serializers.Serializer):
    start = serializers.CharField()
    total = serializers.IntegerField()
    counts = serializers.DictField(
        child=serializers.IntegerField(), help_text="Finished runs by outcome."
    )


class StatsRunsOverTimeSerializer(serializers.Serializer):
    bucket = serializers.ChoiceField(choices=["hour", "day"])
    buckets = StatsBucketSerializer(many=True)
    totals = serializers.DictField(child=serializers.IntegerField())


class StatsFailureClassSerializer(serializers.Serializer):
    error_class = serializers.CharField()
    attempts = serializers.IntegerField()


class StatsFingerprintSerializer(serializers.Serializer):
    fingerprint = serializers.CharField()
    error_class = serializers.CharField()
    agent = serializers.CharField()
    error_type = serializers.CharField()
    message = serializers.CharField(help_text="At most 200 characters.")
    attempts = serializers.IntegerField()


class StatsFailuresSerializer(serializers.Serializer):
    by_class = StatsFailureClassSerializer(many=True)
    top_fingerprints = StatsFingerprintSerializer(many=True)


class StatsAgentCountSerializer(serializers.Serializer):
    agent = serializers.CharField()
    count = serializers.IntegerField()


class StatsLeaseLossesSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    by_agent = StatsAgentCountSerializer(many=True)


class StatsWorkersSerializer(serializers.Serializer):
    alive = serializers.IntegerField()
    stale = serializers.IntegerField()
    gone = serializers.IntegerField()


class StatsCostSerializer(serializers.Serializer):
    agent = serializers.CharField()
    cost = serializers.CharField(help_text="A decimal, as text.")
    runs = serializers.IntegerField(help_text="Runs finished in the window.")


class OperationsStatsSerializer(serializers.Serializer):
    window = serializers.ChoiceField(choices=list(WINDOWS))
    since = serializers.CharField(help_text="The window's start: a whole hour, or a UTC day.")
    now = serializers.CharField()
    rolled_at = serializers.CharField(
        allow_null=True,
        help_text="When the sweep last counted finished runs, costs and failures (null: never).",
    )
    open_requests = StatsOpenRequestSerializer(many=True)
    answer_times = StatsAnswerTimesSerializer()
    request_outcomes = StatsRequestOutcomesSerializer()
    runs_over_time = StatsRunsOverTimeSerializer()
    failures = StatsFailuresSerializer()
    lease_losses = StatsLeaseLossesSerializer()
    workers = StatsWorkersSerializer()
    cost_by_agent = StatsCostSerializer(many=True)


def stats_data(stats: dict[str, Any]) -> dict[str, Any]:
    """The figures with times in ISO 8601 UTC and decimals as text."""
    return {
        **stats,
        "since": utc(stats["since"]),
        "now": utc(stats["now"]),
        "rolled_at": utc(stats["rolled_at"]),
        "open_requests": [
            {**row, "oldest_at": utc(row["oldest_at"])} for row in stats["open_requests"]
        ],
        "runs_over_time": {
            **stats["runs_over_time"],
            "buckets": [
                {**b, "start": utc(b["start"])} for b in stats["runs_over_time"]["buckets"]
            ],
        },
        "cost_by_agent": [{**row, "cost": str(row["cost"])} for row in stats["cost_by_agent"]],
    }


class OperationsStatsApi(QueryValidated, APIView):
    """The operations page's figures."""

    class QuerySerializer(serializers.Serializer):
        window = serializers.ChoiceField(
            choices=list(WINDOWS),
            required=False,
            default=DEFAULT_WINDOW,
            help_text="`24h`: this hour and the 23 before; `7d`: today (UTC) and the 6 days "
            "before.",
        )

    @extend_schema(
        tags=["stats"],
        operation_id="stats_operations",
        parameters=[QuerySerializer],
        description="The state now (open requests by agent and kind with the oldest, workers "
        "alive) and over the window (time to answer by agent and approver group, expired, "
        "denied and sent-back shares, finished runs by outcome per hour or day, failed "
        "attempts by class and top fingerprints, lease losses, cost by agent). Finished "
        "runs, costs and failures come from the sweep's hourly rollup, as of `rolled_at`. "
        "Needs `runs.view_worker`.",
        responses={200: OperationsStatsSerializer, **problems(*AUTH_CODES, "invalid_input")},
    )
    def get(self, request: Request) -> Response:
        require_perm(request.user, VIEW_OPERATIONS)
        query = self.query(request)
        return Response(stats_data(operations_stats(window=query["window"])))
