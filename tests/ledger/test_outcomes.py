"""side_effect_record_outcome: a fact, never fenced; late reports flagged, never lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import services as ledger
from ledger.models import SideEffect
from runs import services
from runs.errors import HoldpointError
from runs.models import Run
from tests.ledger.helpers import begin, crash, event_types, events
from tests.runs.factory import claim, epochs, start

pytestmark = pytest.mark.django_db

CONFIG = {"document": "app", "content": {"a": 1}}


def fence(lease) -> dict[str, int]:
    return {"lease_epoch": lease.lease_epoch, "cancel_epoch": lease.cancel_epoch}


def pending(lease, step: str = "notify") -> str:
    return begin(lease, step=step, tool="config_store", target="app", request=CONFIG).operation_id


def test_the_live_worker_records_a_confirmed_outcome(config_dir: Path) -> None:
    run = start()
    lease = claim("w1")
    op = pending(lease)
    effect = ledger.side_effect_record_outcome(
        operation_id=op,
        status="confirmed",
        external_reference="app@v1",
        result={"version": 1},
        **fence(lease),
    )
    assert (effect.status, effect.external_reference, effect.late) == ("confirmed", "app@v1", False)
    assert effect.outcome_actor == "worker:w1" and effect.outcome_at is not None
    assert event_types(run.id) == ["side_effect.begun", "side_effect.confirmed"]


def test_a_stale_workers_outcome_is_recorded_late_with_an_event(config_dir: Path) -> None:
    run = start()
    old = claim("w1")
    op = pending(old)
    crash(old, "w2")
    effect = ledger.side_effect_record_outcome(
        operation_id=op, status="confirmed", external_reference="app@v1", **fence(old)
    )
    assert (effect.status, effect.late) == ("confirmed", True)
    assert effect.outcome_actor == "worker:w1"
    kind, payload = events(run.id)[-1]
    assert kind == "side_effect.late_outcome"
    assert payload["late"] is True and payload["status"] == "confirmed"


def test_an_outcome_is_recorded_even_after_the_run_was_cancelled(config_dir: Path) -> None:
    run = start()
    lease = claim()
    op = pending(lease)
    services.run_cancel(run_id=run.id, reason="stop")
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="cancelled"
    )
    assert Run.objects.get(pk=run.id).status == "cancelled"
    effect = ledger.side_effect_record_outcome(
        operation_id=op, status="failed", error={"message": "refused"}, **fence(lease)
    )
    assert (effect.status, effect.late, effect.error) == ("failed", True, {"message": "refused"})


def test_an_outcome_is_recorded_for_a_finished_run(config_dir: Path) -> None:
    run = start()
    lease = claim()
    op = pending(lease)
    services.attempt_complete(**epochs(lease), result={})
    effect = ledger.side_effect_record_outcome(operation_id=op, status="unknown", **fence(lease))
    assert (effect.status, effect.late) == ("unknown", True)
    assert Run.objects.get(pk=run.id).status == "succeeded"


def test_without_epochs_an_outcome_is_judged_by_the_attempt_that_began_it(
    config_dir: Path,
) -> None:
    # Issue 13, finding 13: the server knows whether the effect's attempt still holds the
    # run, so a worker's report without epochs is late once another attempt took over.
    start()
    lease = claim()
    live = ledger.side_effect_record_outcome(operation_id=pending(lease), status="confirmed")
    assert live.late is False
    op = pending(lease, step="second")
    crash(lease)
    effect = ledger.side_effect_record_outcome(operation_id=op, status="confirmed")
    assert effect.late is True


def test_a_person_or_the_reconciler_is_never_late(config_dir: Path) -> None:
    start()
    lease = claim()
    op = pending(lease)
    crash(lease)
    effect = ledger.side_effect_record_outcome(
        operation_id=op, status="confirmed", actor="reconciler"
    )
    assert effect.late is False


def test_a_weaker_report_after_a_stronger_one_changes_nothing_but_is_kept(
    config_dir: Path,
) -> None:
    run = start()
    lease = claim()
    op = pending(lease)
    ledger.side_effect_record_outcome(operation_id=op, status="confirmed", external_reference="r1")
    effect = ledger.side_effect_record_outcome(operation_id=op, status="unknown", **fence(lease))
    assert effect.status == "confirmed"
    kind, payload = events(run.id)[-1]
    assert kind == "side_effect.outcome_ignored"
    assert (
        payload["reported_status"] == "unknown"
        and payload["reason"] == "the effect is already confirmed"
    )


def test_a_confirmation_settles_an_unknown(config_dir: Path) -> None:
    start()
    lease = claim()
    op = pending(lease)
    ledger.side_effect_record_outcome(operation_id=op, status="unknown", error="timed out")
    effect = ledger.side_effect_record_outcome(
        operation_id=op, status="confirmed", external_reference="app@v1"
    )
    assert (effect.status, effect.error) == ("confirmed", None)


def test_the_same_report_twice_writes_one_event(config_dir: Path) -> None:
    run = start()
    lease = claim()
    op = pending(lease)
    for _ in range(2):
        ledger.side_effect_record_outcome(
            operation_id=op, status="confirmed", external_reference="app@v1", **fence(lease)
        )
    assert event_types(run.id) == ["side_effect.begun", "side_effect.confirmed"]
    ledger.side_effect_record_outcome(
        operation_id=op, status="confirmed", external_reference="app@v9"
    )
    assert SideEffect.objects.get(pk=op).external_reference == "app@v1"
    assert event_types(run.id)[-1] == "side_effect.outcome_ignored"


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"operation_id": "op_missing", "status": "confirmed"}, "not_found"),
        ({"status": "pending"}, "invalid_input"),
        ({"status": "confirmed", "external_reference": "x" * 501}, "invalid_input"),
        ({"status": "failed", "error": 42}, "invalid_input"),
        ({"status": "failed", "lease_epoch": "1"}, "invalid_input"),
    ],
)
def test_it_refuses_bad_reports(kwargs: dict, code: str, config_dir: Path) -> None:
    start()
    lease = claim()
    kwargs.setdefault("operation_id", pending(lease))
    with pytest.raises(HoldpointError) as exc:
        ledger.side_effect_record_outcome(**kwargs)
    assert exc.value.code == code


def test_look_up_of_an_effect_that_is_no_longer_pending_asks_nothing(config_dir: Path) -> None:
    start()
    effect = ledger.side_effect_perform(
        **epochs(claim()),
        step_id="rotate",
        tool="config_store",
        target="app",
        request={"document": "app", "content": {}},
    ).side_effect
    looked = ledger.side_effect_look_up(operation_id=effect.operation_id)
    assert looked.outcome == "already_recorded" and looked.side_effect.status == "confirmed"
