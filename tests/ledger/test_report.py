"""The run's side-effect report: five groups in the order people read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ledger import services as ledger
from ledger.selectors import report_for_run, side_effects_for_run
from tests.ledger.conftest import Receiver
from tests.ledger.helpers import hook, perform
from tests.runs.factory import claim, start

pytestmark = pytest.mark.django_db


def a_run_with_one_effect_of_each_kind(
    receiver: Receiver, operator: Any
) -> tuple[Any, dict[str, Any]]:
    # Approvals at start are an approval: the factory starts the run as an admin (ada).
    run = start(approvals=["announce", "notify-refused", "notify-slow"])
    lease = claim()
    ops: dict[str, Any] = {}
    ops["happened"] = perform(
        lease,
        step="rotate",
        tool="config_store",
        target="staging/auth/config",
        request={"document": "staging/auth/config", "content": {"ttl": 60}},
    ).side_effect
    ops["compensated"] = perform(
        lease,
        step="flag",
        tool="config_store",
        target="staging/flags",
        request={"document": "staging/flags", "content": {"beta": True}},
    ).side_effect
    ledger.side_effect_compensate(operation_id=ops["compensated"].operation_id, user=operator)
    ops["cannot_be_undone"] = perform(
        lease,
        step="announce",
        tool="email",
        target="ops@example.com",
        request={"to": "ops@example.com", "subject": "Rotated"},
    ).side_effect
    receiver.mode = "reject"
    ops["did_not_happen"] = perform(
        lease, step="notify-refused", request=hook(receiver)
    ).side_effect
    receiver.mode = "slow"
    ops["unknown"] = perform(lease, step="notify-slow", request=hook(receiver)).side_effect
    return run, ops


def test_the_report_has_one_group_per_kind_in_order_with_counts_and_rows(
    receiver: Receiver, operator: Any, config_dir: Path, mailbox: list[Any]
) -> None:
    run, ops = a_run_with_one_effect_of_each_kind(receiver, operator)
    report = report_for_run(run.id)
    assert [(g["key"], g["title"], g["count"]) for g in report["groups"]] == [
        ("unknown", "Unknown — needs reconciliation", 1),
        ("cannot_be_undone", "Cannot be undone", 1),
        ("happened", "Happened", 1),
        ("compensated", "Compensated", 1),
        ("did_not_happen", "Did not happen", 1),
    ]
    assert report["total"] == 5 and report["needs_reconciliation"] == 1
    rows = {g["key"]: g["rows"][0] for g in report["groups"]}
    for key, effect in ops.items():
        assert rows[key]["operation_id"] == effect.operation_id, key

    unknown = rows["unknown"]
    assert unknown["needs_reconciliation"] is True and unknown["status"] == "unknown"
    assert unknown["error"]["type"] == "OutcomeUnknown"

    email = rows["cannot_be_undone"]
    assert email["tool"] == "email" and email["target"] == "ops@example.com"
    assert email["external_reference"] == ops["cannot_be_undone"].external_reference
    assert email["external_reference"].startswith("<")
    assert email["approved_by"] == "ada"
    assert email["approval_comment"] == "Approved when the run was started."
    assert email["can_compensate"] is False

    happened = rows["happened"]
    assert happened["external_reference"] == "staging/auth/config@v1"
    assert happened["idempotency_key"] == ops["happened"].idempotency_key
    assert happened["time"] == happened["outcome_at"] is not None
    assert happened["approved_by"] is None and happened["can_compensate"] is True

    compensated = rows["compensated"]
    assert compensated["compensation"]["external_reference"] == "staging/flags@v2"
    assert compensated["compensation"]["by"] == "user:olivia"
    assert compensated["can_compensate"] is False

    refused = rows["did_not_happen"]
    assert refused["status"] == "failed" and refused["error"]["details"]["status"] == 422


def test_a_run_without_side_effects_has_an_empty_report() -> None:
    run = start()
    report = report_for_run(run.id)
    assert report["total"] == 0
    assert [g["count"] for g in report["groups"]] == [0, 0, 0, 0, 0]


def test_side_effects_for_run_are_in_the_order_they_began(
    config_dir: Path,
) -> None:
    run = start()
    lease = claim()
    for step in ("a", "b", "c"):
        perform(
            lease,
            step=step,
            tool="config_store",
            target=step,
            request={"document": step, "content": 1},
        )
    start()  # another run's effects are not mixed in
    assert [e.step_id for e in side_effects_for_run(run.id)] == ["a", "b", "c"]
