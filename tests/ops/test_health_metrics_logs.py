"""/healthz, /metrics and JSON log lines."""

from __future__ import annotations

import json
import logging

import pytest
from django.test import Client, override_settings

from config.logging import JsonFormatter
from runs import services
from runs.errors import HoldpointError
from runs.logcontext import ContextFilter, bind
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db

UNREACHABLE_REDIS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]},
    }
}


def test_it_reports_healthy_database_and_channel_layer(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "channel_layer": "ok"}


@override_settings(CHANNEL_LAYERS=UNREACHABLE_REDIS)
def test_it_reports_an_unreachable_channel_layer_as_503(client: Client) -> None:
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    try:
        response = client.get("/healthz")
    finally:
        channel_layers.backends.clear()
    assert response.status_code == 503
    assert response.json()["database"] == "ok"
    assert response.json()["channel_layer"].startswith("error")


def metric(body: str, name: str) -> float:
    for line in body.splitlines():
        if line.rsplit(" ", 1)[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_it_exports_runs_requests_stale_writes_and_control_operations(client: Client) -> None:
    stale = 'holdpoint_stale_writes_rejected_total{reason="stale_after_cancel"}'
    not_found = 'holdpoint_control_operations_total{operation="cancel",outcome="not_found"}'
    before = client.get("/metrics").content.decode()
    run = start()
    lease = claim()
    services.run_cancel(run_id=run.id)
    with pytest.raises(HoldpointError):
        services.attempt_complete(**epochs(lease), result={})
    with pytest.raises(HoldpointError):
        services.run_cancel(run_id="run_missing")
    body = client.get("/metrics").content.decode()
    assert metric(body, 'holdpoint_runs{status="cancel_requested"}') == 1
    assert metric(body, 'holdpoint_runs{status="queued"}') == 0
    assert metric(body, stale) == metric(before, stale) + 1
    assert metric(body, not_found) == metric(before, not_found) + 1
    assert 'holdpoint_control_operation_seconds_bucket{le="0.1",operation="cancel"}' in body
    assert metric(body, "holdpoint_pending_requests") == 0


@override_settings(HOLDPOINT_METRICS_TOKEN="s3cret")
def test_metrics_can_require_a_bearer_token(client: Client) -> None:
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_json_log_lines_carry_run_and_attempt_ids() -> None:
    record = logging.LogRecord(
        "holdpoint.worker", logging.INFO, __file__, 1, "step %s done", ("plan",), None
    )
    with bind(run_id="run_1", attempt_id="att_2"):
        ContextFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "step plan done"
    assert line["run_id"] == "run_1" and line["attempt_id"] == "att_2"
    assert line["level"] == "INFO" and line["time"].endswith("+00:00")


def test_it_exports_paused_runs_and_paused_agents(client: Client) -> None:
    body = client.get("/metrics").content.decode()
    assert metric(body, "holdpoint_paused_runs") == 0
    assert metric(body, "holdpoint_paused_agents") == 0
    services.run_pause(run_id=start().id, reason="look")
    services.agent_pause(agent="test-agent", reason="incident")
    body = client.get("/metrics").content.decode()
    assert metric(body, "holdpoint_paused_runs") == 1
    assert metric(body, 'holdpoint_runs{status="paused"}') == 1
    assert metric(body, "holdpoint_paused_agents") == 1
    assert metric(body, 'holdpoint_control_operations_total{operation="pause",outcome="ok"}') >= 1
