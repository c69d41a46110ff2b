"""Operational endpoints: ``/healthz`` for load balancers, ``/metrics`` for Prometheus."""

from __future__ import annotations

import hmac
import uuid

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from runs.metrics import register_database_collector


async def _channel_layer_round_trip() -> None:
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer is configured")
    channel = await layer.new_channel("healthz.")
    token = uuid.uuid4().hex
    await layer.send(channel, {"type": "healthz", "token": token})
    message = await layer.receive(channel)
    if message.get("token") != token:
        raise RuntimeError("the channel layer returned another message")


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - a health check reports any failure as unhealthy
        checks["database"] = f"error: {exc.__class__.__name__}"
    try:
        async_to_sync(_channel_layer_round_trip)()
        checks["channel_layer"] = "ok"
    except Exception as exc:  # noqa: BLE001 - a health check reports any failure as unhealthy
        checks["channel_layer"] = f"error: {exc.__class__.__name__}"
    healthy = all(v == "ok" for v in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "error", **checks}, status=200 if healthy else 503
    )


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.HOLDPOINT_METRICS_TOKEN
    if not token and not settings.HOLDPOINT_METRICS_PUBLIC:
        # Production without a token: the counts are nobody's business (config/checks.py).
        return HttpResponse(
            "metrics are off: set HOLDPOINT_METRICS_TOKEN (or HOLDPOINT_METRICS_PUBLIC=true)\n",
            status=403,
            content_type="text/plain",
        )
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            return HttpResponse(
                "metrics need a bearer token\n", status=401, content_type="text/plain"
            )
    register_database_collector()
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)
