"""ctx.side_effect: the ledger's begin / act / record flow, as a step sees it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.tools import (
    ActionFailed,
    Outcome,
    OutcomeUnknown,
    ToolResult,
    register_tool,
    unregister_tool,
)
from runs import services
from runs.errors import HoldpointError
from runs.models import Attempt, InputRequest
from runtime.executor import Outcome as Ended
from runtime.sdk import ApprovalDenied
from tests.runs.factory import allow_preapproval, preapprover
from tests.runtime.conftest import claim, events, expire_lease, fresh, make_due, run_next

pytestmark = pytest.mark.django_db


class CountingTool:
    """An external system that counts what it did per idempotency key."""

    def __init__(self, name: str, reversibility: str = "reversible") -> None:
        self.name = name
        self.reversibility = reversibility
        self.done: dict[str, dict[str, Any]] = {}
        self.executed: Counter[str] = Counter()
        self.next_error: Exception | None = None
        self.lookup_error: Exception | None = None

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        self.executed[idempotency_key] += 1
        if self.next_error is not None:
            error, self.next_error = self.next_error, None
            raise error
        self.done.setdefault(idempotency_key, {"echo": request, "n": len(self.done) + 1})
        return ToolResult(
            external_reference=f"ext-{self.done[idempotency_key]['n']}",
            result=self.done[idempotency_key],
        )

    def lookup(self, idempotency_key: str) -> Outcome | None:
        if self.lookup_error is not None:
            raise self.lookup_error
        if idempotency_key not in self.done:
            return None
        record = self.done[idempotency_key]
        return Outcome(status="confirmed", external_reference=f"ext-{record['n']}", result=record)

    def compensate(self, side_effect: Any) -> ToolResult:
        return ToolResult(external_reference="undone")


@pytest.fixture
def tool() -> Iterator[CountingTool]:
    counting = register_tool(CountingTool("counting"))
    yield counting  # type: ignore[misc]
    unregister_tool("counting")


@pytest.fixture
def irreversible() -> Iterator[CountingTool]:
    counting = register_tool(CountingTool("launcher", "irreversible"))
    yield counting  # type: ignore[misc]
    unregister_tool("launcher")


def answer(run, value) -> InputRequest:
    request = fresh(run).pending_request
    services.run_resume(
        run_id=run.id, request_id=request.id, checkpoint_id=request.checkpoint_id, value=value
    )
    return request


def test_a_confirmed_effect_is_reused_not_repeated_when_the_step_runs_again(
    make_agent, tool
) -> None:
    agent = make_agent()

    @agent.step
    def apply(ctx, state):
        written = ctx.side_effect("counting", "staging/auth/config", {"keep": ["v2"]})
        ctx.ask("Anything else?", {"more": "boolean"})
        return ctx.done({"ref": written.external_reference, "how": written.decision})

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Ended.INTERRUPTED
    answer(run, {"more": False})
    assert run_next(agent) == Ended.SUCCEEDED
    assert fresh(run).result == {"ref": "ext-1", "how": "reuse"}
    (effect,) = SideEffect.objects.filter(run=run)
    assert (effect.status, effect.step_id, effect.external_reference) == (
        "confirmed",
        "apply.counting",
        "ext-1",
    )
    assert tool.executed == {effect.idempotency_key: 1}


def test_an_effect_left_pending_by_a_crashed_worker_is_looked_up(make_agent, tool) -> None:
    agent = make_agent()

    @agent.step
    def send(ctx, state):
        return ctx.done(ctx.side_effect("counting", "t", {"x": 1}).decision)

    run = services.run_start(agent=agent.name, input={})
    lease = claim(agent, "crashed")
    cp = services.checkpoint_save(
        attempt_id=lease.attempt_id, lease_epoch=1, cancel_epoch=0, step="send", state={}
    )
    assert cp.number == 1
    begin = ledger.side_effect_begin(
        attempt_id=lease.attempt_id,
        lease_epoch=1,
        cancel_epoch=0,
        step_id="send.counting",
        tool="counting",
        target="t",
        request={"x": 1},
    )
    tool.execute({"x": 1}, begin.idempotency_key)  # it acted, then the worker died
    expire_lease(run.id)
    services.leases_expire()
    assert run_next(agent, "w2") == Ended.SUCCEEDED
    assert fresh(run).result == "look_up"
    assert tool.executed[begin.idempotency_key] == 1
    assert SideEffect.objects.get(pk=begin.operation_id).status == "confirmed"


def test_a_pending_effect_that_never_arrived_is_done_once_with_its_key(make_agent, tool) -> None:
    agent = make_agent()

    @agent.step
    def send(ctx, state):
        return ctx.done(ctx.side_effect("counting", "t", {"x": 1}).decision)

    run = services.run_start(agent=agent.name, input={})
    lease = claim(agent, "crashed")
    services.checkpoint_save(
        attempt_id=lease.attempt_id, lease_epoch=1, cancel_epoch=0, step="send", state={}
    )
    begin = ledger.side_effect_begin(
        attempt_id=lease.attempt_id,
        lease_epoch=1,
        cancel_epoch=0,
        step_id="send.counting",
        tool="counting",
        target="t",
        request={"x": 1},
    )
    expire_lease(run.id)  # died before the request left
    services.leases_expire()
    assert run_next(agent, "w2") == Ended.SUCCEEDED
    assert fresh(run).result == "look_up"
    assert tool.executed == {begin.idempotency_key: 1}


def test_an_unknown_outcome_stops_the_run_until_it_is_reconciled(make_agent, tool) -> None:
    agent = make_agent()

    @agent.step
    def send(ctx, state):
        try:
            ref = ctx.side_effect("counting", "t", {"x": 1}).external_reference
        except Exception:  # an agent cannot talk itself out of an unknown outcome
            ref = "guessed"
        return ctx.done(ref)

    tool.next_error = OutcomeUnknown("no answer in time")
    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Ended.FAILED
    run = fresh(run)
    assert (run.status, run.failure_class) == ("failed", "side_effect_unknown")
    (effect,) = SideEffect.objects.filter(run=run)
    assert effect.status == "unknown"
    with pytest.raises(HoldpointError) as exc:
        services.run_retry(run_id=run.id, reason="again")
    assert exc.value.code == "retry_not_allowed"
    ledger.side_effect_reconcile(
        operation_id=effect.operation_id, outcome="not_applied", note="receiver has no record"
    )
    services.run_retry(run_id=run.id, reason="reconciled")
    assert run_next(agent) == Ended.SUCCEEDED
    assert fresh(run).result == "ext-1"
    assert tool.executed[effect.idempotency_key] == 2  # acted again, with the same key


def test_a_refused_action_fails_the_attempt_and_a_retry_acts_again(make_agent, tool) -> None:
    agent = make_agent()

    @agent.step
    def send(ctx, state):
        return ctx.done(ctx.side_effect("counting", "t", {"x": 1}).external_reference)

    tool.next_error = ActionFailed("503 from the gateway, nothing sent")
    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Ended.FAILED
    run = fresh(run)
    assert run.status == "waiting"
    assert Attempt.objects.get(run=run, number=1).error_type == "SideEffectFailed"
    make_due(run.id)
    assert run_next(agent) == Ended.SUCCEEDED
    assert fresh(run).result == "ext-1"


def test_an_irreversible_effect_asks_for_approval_first(make_agent, irreversible) -> None:
    agent = make_agent()

    @agent.step
    def launch(ctx, state):
        return ctx.done(ctx.side_effect("launcher", "prod", {"go": True}).external_reference)

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Ended.INTERRUPTED
    run = fresh(run)
    assert run.status == "auth_required"
    request = run.pending_request
    assert request.step_id == "launch.launcher"
    assert request.action["reversibility"] == "irreversible"
    assert request.action["change"] == {"go": True}
    assert not irreversible.executed and not SideEffect.objects.filter(run=run).exists()
    answer(run, {"decision": "approve"})
    assert run_next(agent) == Ended.SUCCEEDED
    assert fresh(run).result == "ext-1"
    assert SideEffect.objects.get(run=run).approval["request_id"] == request.id


def test_a_denied_irreversible_effect_raises_approval_denied(make_agent, irreversible) -> None:
    agent = make_agent()

    @agent.step
    def launch(ctx, state):
        try:
            ctx.side_effect("launcher", "prod", {"go": True})
        except ApprovalDenied as denied:
            return ctx.done({"launched": False, "why": denied.approval.comment})
        return ctx.done({"launched": True})

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    answer(run, {"decision": "deny", "comment": "not on a Friday"})
    assert run_next(agent) == Ended.SUCCEEDED
    assert fresh(run).result == {"launched": False, "why": "not on a Friday"}
    assert not irreversible.executed


def test_an_approval_given_at_start_lets_the_irreversible_act(make_agent, irreversible) -> None:
    agent = make_agent()

    @agent.step
    def launch(ctx, state):
        return ctx.done(ctx.side_effect("launcher", "prod", {"go": True}).decision)

    allow_preapproval(agent.name)
    run = services.run_start(
        agent=agent.name, input={}, approvals=["launch.launcher"], user=preapprover()
    )
    assert run_next(agent) == Ended.SUCCEEDED
    assert fresh(run).result == "act"


def test_a_compensating_action_makes_the_call_compensable(make_agent, irreversible) -> None:
    agent = make_agent()

    @agent.step
    def launch(ctx, state):
        done = ctx.side_effect(
            "launcher", "prod", {"go": True}, compensate={"undo": "stop"}, key="rocket"
        )
        return ctx.done(done.decision)

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Ended.SUCCEEDED
    effect = SideEffect.objects.get(run=run)
    assert (effect.step_id, effect.reversibility) == ("launch.rocket", "compensable")


def test_a_worker_that_lost_its_lease_records_its_outcome_late_and_stops(make_agent, tool) -> None:
    agent = make_agent()

    @agent.step
    def send(ctx, state):
        ctx.side_effect("counting", "t", {"x": 1})
        return ctx.next("after", {})

    @agent.step
    def after(ctx, state):
        return ctx.done()

    original = tool.execute

    def slow_execute(request: Any, key: str) -> ToolResult:
        # While the request is out, the lease runs out and another worker takes the run.
        expire_lease(run.id)
        services.leases_expire()
        claim(agent, "w2")
        return original(request, key)

    tool.execute = slow_execute  # type: ignore[method-assign]
    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent, "w1") == Ended.ABANDONED
    effect = SideEffect.objects.get(run=run)
    assert (effect.status, effect.late) == ("confirmed", True)
    assert [e.type for e in events(run.id) if e.type.startswith("side_effect.")] == [
        "side_effect.begun",
        "side_effect.late_outcome",
    ]
    assert not events(run.id, "checkpoint.saved")[1:]  # the step's next write was not made
