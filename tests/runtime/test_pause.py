"""The runtime honours a pause at the step boundary, and breakpoints every time."""

from __future__ import annotations

import pytest

from runs import services
from runs.models import Attempt, InputRequest
from runtime.executor import Outcome
from tests.runtime.conftest import event_types, fresh, run_next

pytestmark = pytest.mark.django_db


def test_a_pause_during_a_step_lets_it_finish_and_stops_at_the_next_checkpoint(
    make_agent,
) -> None:
    agent = make_agent()
    ran: list[str] = []

    @agent.step("work")
    def work(ctx, state):
        ran.append("work")
        # Someone pauses the run while this step is busy (in the same thread, so no signal
        # reaches the worker: the checkpoint's answer alone must stop it at the boundary).
        if len(ran) == 1:
            services.run_pause(run_id=ctx.run_id, reason="look first", actor="user:olivia")
        return ctx.next("after", {"worked": True})

    @agent.step
    def after(ctx, state):
        ran.append("after")
        return ctx.done(state)

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.PAUSED
    run = fresh(run)
    assert run.status == "paused" and ran == ["work"]
    request = InputRequest.objects.get(pk=run.pending_request_id)
    assert request.checkpoint.step == "after" and request.checkpoint.state == {"worked": True}
    assert event_types(run.id)[-1] == "run.paused"
    services.run_resume(run_id=run.id, request_id=request.id, checkpoint_id=request.checkpoint_id)
    assert run_next(agent) == Outcome.SUCCEEDED
    assert ran == ["work", "after"]
    assert fresh(run).result == {"worked": True}


def test_a_breakpoint_pauses_before_its_step_every_time_the_loop_reaches_it(make_agent) -> None:
    agent = make_agent()
    ran: list[str] = []

    @agent.step("check")
    def check(ctx, state):
        ran.append("check")
        if state.get("acted", 0) >= 2:
            return ctx.done({"acted": state["acted"]})
        return ctx.next("act", state)

    @agent.step
    def act(ctx, state):
        ran.append("act")
        return ctx.next("check", {"acted": state.get("acted", 0) + 1})

    run = services.run_start(agent=agent.name, input={}, pause_before=["act"])
    for round_ in (1, 2):
        assert run_next(agent) == Outcome.PAUSED
        run = fresh(run)
        assert run.status == "paused"
        request = InputRequest.objects.get(pk=run.pending_request_id)
        assert request.prompt == "breakpoint before act"
        assert request.context["breakpoint"] == "act"
        assert request.checkpoint.step == "act"
        assert ran.count("act") == round_ - 1
        services.run_resume(
            run_id=run.id, request_id=request.id, checkpoint_id=request.checkpoint_id
        )
    assert run_next(agent) == Outcome.SUCCEEDED
    assert ran == ["check", "act", "check", "act", "check"]
    assert fresh(run).result == {"acted": 2}
    assert InputRequest.objects.filter(run=run, kind="pause").count() == 2
    assert Attempt.objects.filter(run=run, status="interrupted").count() == 2


def test_a_closed_gate_stops_the_attempt_at_its_first_boundary(make_agent) -> None:
    agent = make_agent()
    ran: list[str] = []

    @agent.step("one")
    def one(ctx, state):
        ran.append("one")
        # The gate closes while the step runs; this worker hears of it at the boundary.
        if len(ran) == 1:
            services.agent_pause(agent=agent.name, reason="incident", actor="user:ines")
        return ctx.next("two", {})

    @agent.step
    def two(ctx, state):
        ran.append("two")
        return ctx.done(1)

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.PAUSED
    run = fresh(run)
    assert run.status == "queued" and ran == ["one"]
    assert run.current_attempt.reason == "held"
    assert services.attempt_claim(worker_id="w", agents=[agent.name]) is None
    services.agent_unpause(agent=agent.name)
    assert run_next(agent) == Outcome.SUCCEEDED
    assert ran == ["one", "two"]
