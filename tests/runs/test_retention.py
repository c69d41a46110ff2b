"""The retention sweep removes old history of finished runs, never of live ones."""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine
from django.test import override_settings
from django.utils import timezone

from runs import services
from runs.models import Checkpoint, InputRequest, Run, RunEvent
from tests.runs.factory import claim, epochs, interrupted, start

pytestmark = pytest.mark.django_db


def finished_with_history() -> Run:
    run = start()
    lease = claim()
    services.checkpoint_save(**epochs(lease), step="b", state={"x": 1})
    services.attempt_complete(**epochs(lease), result={"ok": True})
    return run


@override_settings(HOLDPOINT_HISTORY_RETENTION_DAYS=30)
def test_it_purges_events_and_checkpoints_of_old_finished_runs_only() -> None:
    old = finished_with_history()
    live, _lease, _cp, request = interrupted()
    with time_machine.travel(timezone.now() + dt.timedelta(days=29)):
        assert services.history_purge() == 0
    with time_machine.travel(timezone.now() + dt.timedelta(days=31)):
        # The live run's question would have expired by now; keep it pending for this test.
        assert services.history_purge() == 1
        assert services.history_purge() == 0  # once is enough
    old.refresh_from_db()
    assert old.history_purged_at is not None and old.latest_checkpoint_id is None
    assert not RunEvent.objects.filter(run=old).exists()
    assert not Checkpoint.objects.filter(run=old).exists()
    assert old.status == "succeeded" and old.result == {"ok": True}
    assert old.attempts.count() == 1
    assert RunEvent.objects.filter(run=live).exists()
    assert Checkpoint.objects.filter(run=live).exists()
    assert InputRequest.objects.get(pk=request.id).checkpoint_id is not None


@override_settings(HOLDPOINT_HISTORY_RETENTION_DAYS=0)
def test_zero_keeps_history_forever() -> None:
    finished_with_history()
    with time_machine.travel(timezone.now() + dt.timedelta(days=3650)):
        assert services.history_purge() == 0


@override_settings(HOLDPOINT_HISTORY_RETENTION_DAYS=30)
def test_it_is_part_of_the_sweep() -> None:
    finished_with_history()
    with time_machine.travel(timezone.now() + dt.timedelta(days=31)):
        report = services.sweep_all()
    assert report.other["history"] == 1
