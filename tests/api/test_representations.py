"""The hand-built representations (api/serializers.py ``run_data`` …) render byte for byte
what DRF's field machinery renders for the same serializers, in every state a run goes
through."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from api.serializers import AttemptSerializer, InputRequestSerializer, RunSerializer
from runs import services
from runs.models import Run
from tests.conftest import TEST_AGENT

pytestmark = pytest.mark.django_db

SCHEMA = {"type": "object", "properties": {"v": {"type": "string"}}, "required": ["v"]}


def _fields_machinery(monkeypatch: pytest.MonkeyPatch, run: Run) -> bytes:
    with monkeypatch.context() as patch:
        for cls in (RunSerializer, AttemptSerializer, InputRequestSerializer):
            patch.setattr(cls, "to_representation", serializers.ModelSerializer.to_representation)
        return JSONRenderer().render(RunSerializer(run).data)


def _runs(operator: User) -> list[Run]:
    queued = services.run_start(agent=TEST_AGENT, input={"n": 1})
    waiting = services.run_start(agent=TEST_AGENT, input={"n": 2})
    lease = services.attempt_claim(worker_id="w-1")
    assert lease is not None and lease.run_id == queued.id
    running = Run.objects.get(pk=queued.pk)
    lease2 = services.attempt_claim(worker_id="w-2")
    assert lease2 is not None and lease2.run_id == waiting.id
    epochs: dict[str, Any] = {
        "attempt_id": lease2.attempt_id,
        "lease_epoch": lease2.lease_epoch,
        "cancel_epoch": lease2.cancel_epoch,
    }
    services.attempt_heartbeat(
        attempt_id=lease2.attempt_id, lease_epoch=lease2.lease_epoch, cost=Decimal("0.1234567")
    )
    checkpoint = services.checkpoint_save(**epochs, step="ask", state={"a": [1, "é"]})
    request = services.attempt_interrupt(
        **epochs,
        checkpoint_id=checkpoint.id,
        kind="input_required",
        prompt="Which <b>version</b>?",
        accepted_schema=SCHEMA,
    )
    asked = Run.objects.get(pk=waiting.pk)
    resumed = services.run_resume(
        run_id=waiting.id,
        request_id=request.id,
        checkpoint_id=checkpoint.id,
        value={"v": "2"},
        user=operator,
    )
    cancelled = services.run_cancel(run_id=running.id, reason="stop", user=operator)
    failed_source = services.run_start(agent=TEST_AGENT, input={"n": 3})
    lease3 = services.attempt_claim(worker_id="w-3")
    assert lease3 is not None and lease3.run_id in (failed_source.id, resumed.id)
    services.attempt_fail(
        attempt_id=lease3.attempt_id,
        lease_epoch=lease3.lease_epoch,
        cancel_epoch=lease3.cancel_epoch,
        error={"class": "deterministic", "type": "ValueError", "message": "bad 42"},
    )
    to_cancel = services.run_start(agent=TEST_AGENT, input={"n": 4})
    cancelled_at_once = services.run_cancel(run_id=to_cancel.id, reason="", user=operator)
    retried = services.run_retry(run_id=to_cancel.id, reason="again", user=operator)
    return [
        queued,
        running,
        asked,
        resumed,
        cancelled,
        cancelled_at_once,
        retried,
        *Run.objects.all(),
    ]


def test_a_run_renders_as_drf_renders_it(monkeypatch: pytest.MonkeyPatch, operator: User) -> None:
    runs = _runs(operator)
    for run in runs:
        fresh = Run.objects.select_related(
            "current_attempt", "pending_request", "pending_request__answered_by"
        ).get(pk=run.pk)
        for instance in (run, fresh):
            fast = JSONRenderer().render(RunSerializer(instance).data)
            assert fast == _fields_machinery(monkeypatch, instance), instance.status


def test_lists_render_as_drf_renders_them(monkeypatch: pytest.MonkeyPatch, operator: User) -> None:
    _runs(operator)
    runs = list(Run.objects.order_by("created_at"))
    fast = JSONRenderer().render(RunSerializer(runs, many=True).data)
    with monkeypatch.context() as patch:
        for cls in (RunSerializer, AttemptSerializer, InputRequestSerializer):
            patch.setattr(cls, "to_representation", serializers.ModelSerializer.to_representation)
        slow = JSONRenderer().render(RunSerializer(runs, many=True).data)
    assert fast == slow
