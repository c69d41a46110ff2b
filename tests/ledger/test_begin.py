"""side_effect_begin: every row of the decision table, the fence and the approval rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger import services as ledger
from ledger.models import SideEffect
from runs import services
from runs.errors import HoldpointError
from tests.ledger.conftest import Receiver
from tests.ledger.helpers import begin, crash, event_types, events, hook
from tests.runs.factory import claim, epochs, snapshot, start

pytestmark = pytest.mark.django_db


def config(document: str = "staging/auth/config", content: object = None) -> dict[str, object]:
    return {"document": document, "content": content if content is not None else {"ttl": 60}}


def test_no_record_writes_a_pending_intent_and_answers_act(config_dir: Path) -> None:
    run = start()
    lease = claim()
    answer = begin(
        lease, step="rotate", tool="config_store", target="staging/auth/config", request=config()
    )
    assert answer.decision == "act"
    assert answer.operation_id.startswith("op_")
    assert answer.idempotency_key == ledger.idempotency_key_for(
        run_id=run.id, step_id="rotate", tool="config_store"
    )
    effect = SideEffect.objects.get(pk=answer.operation_id)
    assert (effect.status, effect.attempt_id, effect.reversibility) == (
        "pending",
        lease.attempt_id,
        "reversible",
    )
    assert effect.compensating_action == {
        "action": "restore_previous_version",
        "document": "staging/auth/config",
        "restore_version": None,
    }
    assert event_types(run.id) == ["side_effect.begun"]


def test_the_key_is_the_same_for_every_attempt_and_differs_by_step_and_tool() -> None:
    key = ledger.idempotency_key_for
    assert key(run_id="run_a", step_id="s", tool="t") == key(run_id="run_a", step_id="s", tool="t")
    others = {
        key(run_id="run_b", step_id="s", tool="t"),
        key(run_id="run_a", step_id="s2", tool="t"),
        key(run_id="run_a", step_id="s", tool="t2"),
        key(run_id="run_a", step_id="s", tool="t", generation=1),
    }
    assert key(run_id="run_a", step_id="s", tool="t") not in others and len(others) == 4


def test_pending_answers_look_up_and_moves_responsibility_to_the_new_attempt(
    config_dir: Path,
) -> None:
    start()
    lease = claim()
    first = begin(lease, tool="config_store", request=config())
    lease2 = crash(lease)
    second = begin(lease2, tool="config_store", request=config())
    assert second.decision == "look_up"
    assert (second.operation_id, second.idempotency_key) == (
        first.operation_id,
        first.idempotency_key,
    )
    assert SideEffect.objects.get(pk=first.operation_id).attempt_id == lease2.attempt_id
    assert SideEffect.objects.count() == 1


def test_confirmed_answers_reuse_with_the_recorded_result(config_dir: Path) -> None:
    run = start()
    lease = claim()
    first = begin(lease, tool="config_store", request=config())
    ledger.side_effect_record_outcome(
        operation_id=first.operation_id,
        status="confirmed",
        external_reference="staging/auth/config@v7",
        result={"version": 7},
        **{k: v for k, v in epochs(lease).items() if k != "attempt_id"},
    )
    lease2 = crash(lease)
    again = begin(lease2, tool="config_store", request=config())
    assert again.decision == "reuse"
    assert again.result == {"version": 7}
    assert again.external_reference == "staging/auth/config@v7"
    assert event_types(run.id)[-1] == "side_effect.reused"


def test_unknown_refuses_and_changes_nothing(config_dir: Path) -> None:
    run = start()
    lease = claim()
    first = begin(lease, tool="config_store", request=config())
    ledger.side_effect_record_outcome(operation_id=first.operation_id, status="unknown")
    before = snapshot(run.id)
    effect_before = list(SideEffect.objects.values())
    with pytest.raises(HoldpointError) as exc:
        begin(lease, tool="config_store", request=config())
    assert exc.value.code == "side_effect_unknown" and exc.value.status == 409
    assert exc.value.extra["operation_id"] == first.operation_id
    assert snapshot(run.id) == before
    assert list(SideEffect.objects.values()) == effect_before


def test_failed_answers_act_again_with_the_same_key(config_dir: Path) -> None:
    run = start()
    lease = claim()
    first = begin(lease, tool="config_store", request=config())
    ledger.side_effect_record_outcome(
        operation_id=first.operation_id, status="failed", error="disk full"
    )
    again = begin(lease, tool="config_store", request=config(content={"ttl": 30}))
    assert again.decision == "act"
    assert (again.operation_id, again.idempotency_key) == (
        first.operation_id,
        first.idempotency_key,
    )
    effect = SideEffect.objects.get(pk=first.operation_id)
    assert (effect.status, effect.error, effect.request["content"]) == (
        "pending",
        None,
        {"ttl": 30},
    )
    payload = [p for t, p in events(run.id) if t == "side_effect.begun"][-1]
    assert payload["again_after"]["error"] == {"message": "disk full"}


def test_compensated_answers_act_under_the_next_key(config_dir: Path) -> None:
    start()
    lease = claim()
    done = ledger.side_effect_perform(
        **epochs(lease), step_id="rotate", tool="config_store", target="cfg", request=config()
    )
    ledger.side_effect_compensate(operation_id=done.side_effect.operation_id)
    again = begin(lease, step="rotate", tool="config_store", target="cfg", request=config())
    assert again.decision == "act"
    assert again.operation_id != done.side_effect.operation_id
    assert again.idempotency_key == done.side_effect.idempotency_key + ".1"
    assert SideEffect.objects.get(pk=again.operation_id).generation == 1


def test_a_stale_worker_is_fenced_and_nothing_is_written(receiver: Receiver) -> None:
    run = start(approvals=["notify"])
    lease = claim()
    crash(lease)
    before = snapshot(run.id)
    with pytest.raises(HoldpointError) as exc:
        begin(lease, request=hook(receiver))
    assert exc.value.code == "stale_worker"
    assert snapshot(run.id) == before
    assert not SideEffect.objects.exists()


def test_a_worker_of_a_cancelled_run_is_fenced(receiver: Receiver) -> None:
    run = start(approvals=["notify"])
    lease = claim()
    services.run_cancel(run_id=run.id, reason="stop")
    with pytest.raises(HoldpointError) as exc:
        begin(lease, request=hook(receiver))
    assert exc.value.code == "stale_after_cancel"
    assert not SideEffect.objects.exists()


def test_an_irreversible_effect_without_approval_is_refused(mailbox: list) -> None:
    run = start()
    lease = claim()
    before = snapshot(run.id)
    with pytest.raises(HoldpointError) as exc:
        begin(
            lease,
            step="announce",
            tool="email",
            target="ops@example.com",
            request={"to": "ops@example.com", "subject": "s", "body": "b"},
        )
    assert exc.value.code == "approval_required" and exc.value.status == 409
    assert exc.value.extra == {
        "step_id": "announce",
        "tool": "email",
        "target": "ops@example.com",
        "reversibility": "irreversible",
        "action_hash": ledger.action_hash(
            tool="email",
            target="ops@example.com",
            request={"to": "ops@example.com", "subject": "s", "body": "b"},
        ),
    }
    assert snapshot(run.id) == before
    assert not SideEffect.objects.exists()


def test_an_approval_given_at_start_lets_it_act(approver, mailbox: list) -> None:
    start(approvals=["announce"], user=approver)
    lease = claim()
    answer = begin(
        lease,
        step="announce",
        tool="email",
        target="ops@example.com",
        request={"to": "ops@example.com", "subject": "s"},
    )
    assert answer.decision == "act"
    effect = SideEffect.objects.get(pk=answer.operation_id)
    assert effect.approval["source"] == "start" and effect.approval["by"] == "alice"


def test_an_approval_for_another_step_does_not_count(mailbox: list) -> None:
    start(approvals=["other-step"])
    lease = claim()
    with pytest.raises(HoldpointError) as exc:
        begin(
            lease,
            step="announce",
            tool="email",
            target="x",
            request={"to": "ops@example.com", "subject": "s"},
        )
    assert exc.value.code == "approval_required"


def test_the_webhook_is_irreversible_unless_the_agent_says_how_to_undo_it(
    receiver: Receiver,
) -> None:
    start()
    lease = claim()
    with pytest.raises(HoldpointError) as exc:
        begin(lease, request=hook(receiver))
    assert exc.value.code == "approval_required"
    with pytest.raises(HoldpointError) as exc:
        begin(lease, request=hook(receiver), reversibility="compensable")
    assert exc.value.code == "invalid_input"
    answer = begin(
        lease,
        request=hook(receiver),
        reversibility="compensable",
        compensating_action={"url": receiver.url("/hooks/rollback"), "body": {}},
    )
    assert answer.decision == "act" and answer.reversibility == "compensable"


def test_an_agent_cannot_declare_email_undoable_but_may_declare_a_config_irreversible(
    config_dir: Path,
) -> None:
    start()
    lease = claim()
    with pytest.raises(HoldpointError) as exc:
        begin(
            lease,
            tool="email",
            reversibility="reversible",
            compensating_action={"x": 1},
            request={"to": "a@example.com", "subject": "s"},
        )
    assert exc.value.code == "invalid_input"
    with pytest.raises(HoldpointError) as exc:
        begin(lease, tool="config_store", request=config(), reversibility="irreversible")
    assert exc.value.code == "approval_required"


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"tool": "nope"}, "invalid_input"),
        ({"step": ""}, "invalid_input"),
        ({"target": ""}, "invalid_input"),
        ({"request": ["not", "an", "object"]}, "invalid_input"),
        ({"tool": "config_store", "request": {"document": "../x", "content": 1}}, "invalid_input"),
        ({"reversibility": "sometimes"}, "invalid_input"),
        ({"idempotency_key": "bad\nkey"}, "invalid_input"),
    ],
)
def test_it_refuses_bad_input_before_writing(kwargs: dict, code: str, config_dir: Path) -> None:
    start()
    lease = claim()
    with pytest.raises(HoldpointError) as exc:
        begin(lease, **kwargs)
    assert exc.value.code == code
    assert not SideEffect.objects.exists()


def test_a_supplied_key_is_used_and_cannot_name_another_effect(config_dir: Path) -> None:
    start()
    lease = claim()
    answer = begin(lease, tool="config_store", request=config(), idempotency_key="my-key-1")
    assert answer.idempotency_key == "my-key-1"
    assert (
        begin(lease, tool="config_store", request=config(), idempotency_key="my-key-1").decision
        == "look_up"
    )
    with pytest.raises(HoldpointError) as exc:
        begin(
            lease, step="other", tool="config_store", request=config(), idempotency_key="my-key-1"
        )
    assert exc.value.code == "invalid_input"
    # Another run cannot take it either.
    start()
    lease_b = claim("w-b")
    with pytest.raises(HoldpointError) as exc:
        begin(lease_b, tool="config_store", request=config(), idempotency_key="my-key-1")
    assert exc.value.code == "invalid_input"
    assert exc.value.extra["operation_id"] is None  # another run's operation is not disclosed


def test_the_retry_preview_and_begin_read_one_decision_table() -> None:
    from ledger.models import SideEffectStatus
    from ledger.services import decision_for

    # Every status has a decision, and "unknown" is refused, never looked up.
    assert {s: decision_for(s) for s in SideEffectStatus.values} == {
        "pending": "look_up",
        "confirmed": "reuse",
        "compensation_failed": "reuse",
        "unknown": "refuse",
        "failed": "act",
        "compensated": "act",
    }
    assert decision_for(None) == "act"


def test_a_worker_that_begins_with_the_plan_approved_with_edits_is_told_how_to_run_the_edit(
    approver, mailbox: list
) -> None:
    """An HTTP worker (no SDK) begins with the planned request after an approval with
    edits: the ledger refuses the plan and names the edit and the key to run it under."""
    run = start()
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="announce", state={})
    plan = {"to": ["ops@example.com"], "subject": "deploy done"}
    edit = {"to": ["oncall@example.com"], "subject": "deploy done"}
    request = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="auth_required",
        prompt="Send?",
        step_id="announce",
        action={
            "tool": "email",
            "target": "ops@example.com",
            "change": plan,
            "reversibility": "irreversible",
            "editable": {"schema": {"type": "object"}, "value": plan},
        },
    )
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=cp.id,
        value={"decision": "approve", "edited": edit},
        user=approver,
    )
    lease = claim()
    with pytest.raises(HoldpointError) as exc:
        begin(lease, step="announce", tool="email", target="ops@example.com", request=plan)
    assert exc.value.code == "approval_required"
    assert exc.value.extra["edited"] == edit
    key = exc.value.extra["edited_idempotency_key"]
    assert key == ledger.edited_idempotency_key(
        run_id=run.id, step_id="announce", tool="email", request=edit
    )
    answer = begin(
        lease,
        step="announce",
        tool="email",
        target="ops@example.com",
        request=edit,
        idempotency_key=key,
    )
    assert answer.decision == "act" and answer.idempotency_key == key
    effect = SideEffect.objects.get(pk=answer.operation_id)
    assert effect.approval["original"] == plan and effect.approval["edited"] == edit
    assert effect.approval["by"] == "alice" and effect.approval["edited_by"] == "alice"
