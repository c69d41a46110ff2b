"""The reconciler sweep: it asks tools about keys nobody else will settle."""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import time_machine
from django.utils import timezone

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.tools import ToolResult, get_tool, register_tool, unregister_tool
from runs import services
from tests.ledger.conftest import Receiver
from tests.ledger.helpers import begin, fail_unknown, hook, lose_lease, perform
from tests.runs.factory import claim, start

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _settle(settings: Any) -> None:
    settings.HOLDPOINT_LEDGER_SETTLE_SECONDS = 60


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def later(seconds: float = 61) -> Any:
    return time_machine.travel(timezone.now() + dt.timedelta(seconds=seconds))


def test_it_is_part_of_sweep_all() -> None:
    assert services.sweep_all().other["side_effects"] == 0


def test_a_pending_effect_whose_worker_died_after_acting_is_confirmed(
    receiver: Receiver,
) -> None:
    start(approvals=["deploy"])
    lease = claim()
    answer = begin(lease, step="deploy", request=hook(receiver))
    get_tool("webhook").execute(hook(receiver), answer.idempotency_key)
    lose_lease(lease)  # the worker is gone; the run waits for its next attempt
    assert services.sweep_all().other["side_effects"] == 1
    effect = SideEffect.objects.get(pk=answer.operation_id)
    assert (effect.status, effect.external_reference) == ("confirmed", "dlv_1")
    assert effect.outcome_actor == "system:reconciler"
    assert receiver.performed[answer.idempotency_key] == 1


def test_a_pending_effect_the_receiver_never_saw_did_not_happen(receiver: Receiver) -> None:
    start(approvals=["deploy"])
    lease = claim()
    answer = begin(lease, step="deploy", request=hook(receiver))
    lose_lease(lease)
    assert ledger.side_effects_look_up_stale() == 1
    effect = SideEffect.objects.get(pk=answer.operation_id)
    assert effect.status == "failed" and effect.error["type"] == "NotFound"
    # The next attempt does it, with the same key.
    again = perform(claim("w2"), step="deploy", request=hook(receiver))
    assert (again.decision, again.side_effect.status) == ("act", "confirmed")
    assert receiver.performed[answer.idempotency_key] == 1


def test_a_pending_effect_of_a_live_worker_is_left_alone_until_it_is_overdue(
    receiver: Receiver,
) -> None:
    start(approvals=["deploy"])
    lease = claim(lease_seconds=3600)
    answer = begin(lease, step="deploy", request=hook(receiver))
    assert ledger.side_effects_look_up_stale() == 0
    assert receiver.lookups[answer.idempotency_key] == 0
    with later():
        assert ledger.side_effects_look_up_stale() == 1
    assert SideEffect.objects.get(pk=answer.operation_id).status == "failed"


def test_an_unknown_effect_is_looked_up_once_it_has_settled(
    receiver: Receiver, operator: Any
) -> None:
    receiver.mode = "slow"
    run = start(approvals=["deploy"])
    lease = claim()
    done = perform(lease, step="deploy", request=hook(receiver))
    fail_unknown(lease, done.side_effect)
    receiver.wait_performed(done.side_effect.idempotency_key)
    # Too soon: a slow receiver may still be working on it.
    assert ledger.side_effects_look_up_stale() == 0
    with later():
        assert ledger.side_effects_look_up_stale() == 1
    effect = SideEffect.objects.get(pk=done.side_effect.operation_id)
    assert (effect.status, effect.external_reference) == ("confirmed", "dlv_1")
    assert effect.outcome_actor == "system:reconciler"
    # Settled: the run may be retried, and the retry reuses the result.
    services.run_retry(run_id=run.id, reason="the reconciler settled it", user=operator)
    again = perform(claim("w2"), step="deploy", request=hook(receiver))
    assert (again.decision, again.acted) == ("reuse", False)


def test_it_asks_about_a_key_once_per_settle_period(receiver: Receiver, settings: Any) -> None:
    # A lookup service that cannot be reached: the answer stays "cannot tell".
    settings.HOLDPOINT_WEBHOOK_LOOKUP_URL = f"http://127.0.0.1:{free_port()}/{{idempotency_key}}"
    start(approvals=["deploy"])
    lease = claim()
    answer = begin(lease, step="deploy", request=hook(receiver))
    lose_lease(lease)
    assert ledger.side_effects_look_up_stale() == 0
    first = SideEffect.objects.get(pk=answer.operation_id)
    assert first.status == "pending" and first.looked_up_at is not None
    assert ledger.side_effects_look_up_stale() == 0
    assert SideEffect.objects.get(pk=answer.operation_id).looked_up_at == first.looked_up_at
    with later():
        ledger.side_effects_look_up_stale()
        assert SideEffect.objects.get(pk=answer.operation_id).looked_up_at > first.looked_up_at


def test_it_never_asks_a_tool_that_cannot_tell(mailbox: list[Any]) -> None:
    start(approvals=["announce"])
    lease = claim()
    answer = begin(
        lease,
        step="announce",
        tool="email",
        target="ops@example.com",
        request={"to": "ops@example.com", "subject": "s"},
    )
    lose_lease(lease)
    with later():
        assert ledger.side_effects_look_up_stale() == 0
    effect = SideEffect.objects.get(pk=answer.operation_id)
    assert effect.status == "pending" and effect.looked_up_at is None


class Elsewhere:
    """An in-process tool that knows nothing of another system's keys: asked about any key,
    it has no record."""

    reversibility = "reversible"

    def __init__(self, name: str) -> None:
        self.name = name
        self.asked: list[str] = []

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        raise AssertionError("the server never acts for a remote agent")

    def lookup(self, idempotency_key: str) -> None:
        self.asked.append(idempotency_key)
        return None


@pytest.fixture
def same_name() -> Iterator[Elsewhere]:
    """A tool registered here under the name a remote agent declares for its own tool."""
    tool = Elsewhere("shared-name")
    register_tool(tool)  # type: ignore[arg-type]
    yield tool
    unregister_tool(tool.name)


class Broken(Elsewhere):
    """A tool whose look-up has a bug: it raises something no tool should."""

    def lookup(self, idempotency_key: str) -> None:
        self.asked.append(idempotency_key)
        raise KeyError("HOLDPOINT_CONFORMANCE_DIR")


def test_a_tool_whose_look_up_raises_leaves_its_key_unknown_and_the_sweep_goes_on(
    receiver: Receiver,
) -> None:
    broken = Broken("broken-look-up")
    register_tool(broken)  # type: ignore[arg-type]
    try:
        start(approvals=["deploy"])
        lease = claim()
        first = begin(lease, step="apply", tool="broken-look-up", target="t", request={"v": 1})
        second = begin(lease, step="deploy", request=hook(receiver))
        lose_lease(lease)
        # The broken tool's key stays pending; the other key behind it is still settled.
        assert services.sweep_all().other["side_effects"] == 1
    finally:
        unregister_tool(broken.name)
    assert broken.asked == [first.idempotency_key]
    assert SideEffect.objects.get(pk=first.operation_id).status == "pending"
    assert SideEffect.objects.get(pk=second.operation_id).status == "failed"


def test_a_remote_agents_effect_is_never_asked_of_a_same_named_tool_of_the_server(
    same_name: Elsewhere,
) -> None:
    # The remote agent's worker began the effect, acted in its own process and was killed
    # before it said so. Only its own tool knows the key; the reconciler must not record
    # the "no record" of the server's same-named tool as "failed", or the next attempt
    # would act again (tests/clients: a worker killed between act and outcome).
    services.agent_declare(
        name="remote-shared",
        actor="test",
        tools=[{"name": "shared-name", "reversibility": "reversible"}],
        retry_policy={"max_attempts": 3, "backoff_initial": 0, "backoff_max": 0},
    )
    run = services.run_start(agent="remote-shared", input={})
    lease = services.attempt_claim(worker_id="remote-1", agents=["remote-shared"])
    assert lease is not None
    first = begin(lease, step="apply", tool="shared-name", target="folder", request={"v": 1})
    assert first.decision == "act"
    lose_lease(lease)
    assert services.sweep_all().other["side_effects"] == 0
    with later():  # nor once it has been pending past the settle time
        assert ledger.side_effects_look_up_stale() == 0
    assert same_name.asked == []
    assert SideEffect.objects.get(pk=first.operation_id).status == "pending"
    # The next attempt of the agent is told to look it up with its own tool: never "act".
    second = services.attempt_claim(worker_id="remote-2", agents=["remote-shared"])
    assert second is not None
    again = begin(second, step="apply", tool="shared-name", target="folder", request={"v": 1})
    assert (again.decision, again.idempotency_key) == ("look_up", first.idempotency_key)
    assert SideEffect.objects.get(pk=first.operation_id).run_id == run.id


def test_an_in_process_agents_effect_of_that_tool_is_still_looked_up(
    same_name: Elsewhere,
) -> None:
    services.agent_declare(name="remote-shared", actor="test", tools=["shared-name"])
    start()
    lease = claim()
    answer = begin(lease, step="apply", tool="shared-name", target="folder", request={"v": 1})
    lose_lease(lease)
    assert ledger.side_effects_look_up_stale() == 1
    assert same_name.asked == [answer.idempotency_key]
    assert SideEffect.objects.get(pk=answer.operation_id).status == "failed"


def test_a_remote_agents_effect_is_never_undone_by_a_same_named_tool_of_the_server(
    same_name: Elsewhere,
) -> None:
    """Compensating a remote agent's confirmed effect must not run this process's tool of
    the same name (it would undo something else): the remote tool has no compensating
    action here, so the person is told and nothing runs."""
    from runs.errors import HoldpointError

    compensated: list[Any] = []
    same_name.compensate = compensated.append  # type: ignore[attr-defined]
    services.agent_declare(
        name="remote-shared",
        actor="test",
        tools=[{"name": "shared-name", "reversibility": "reversible"}],
    )
    services.run_start(agent="remote-shared", input={})
    lease = services.attempt_claim(worker_id="remote-1", agents=["remote-shared"])
    assert lease is not None
    effect = begin(lease, step="apply", tool="shared-name", target="folder", request={"v": 1})
    ledger.side_effect_record_outcome(
        operation_id=effect.operation_id, status="confirmed", external_reference="r1"
    )
    with pytest.raises(HoldpointError) as refused:
        ledger.side_effect_compensate(operation_id=effect.operation_id, reason="undo it")
    assert refused.value.code == "invalid_state"
    assert compensated == []
    assert SideEffect.objects.get(pk=effect.operation_id).status == "confirmed"
