"""Steps, checkpoints at step boundaries, and how a step's end becomes the attempt's end."""

from __future__ import annotations

from decimal import Decimal

import pytest

from runs import services
from runs.models import Attempt, Checkpoint
from runtime.executor import Outcome
from runtime.sdk import Deterministic, Transient
from tests.runtime.conftest import event_types, events, fresh, make_due, run_next

pytestmark = pytest.mark.django_db


def three_steps(make_agent):
    agent = make_agent()
    seen: list[tuple[str, dict]] = []

    @agent.step("fetch")
    def fetch(ctx, state):
        seen.append(("fetch", state))
        return ctx.next("transform", {"items": [1, 2, 3]})

    @agent.step
    def transform(ctx, state):
        seen.append(("transform", state))
        return ctx.next("store", {"items": [i * 10 for i in state["items"]]})

    @agent.step
    def store(ctx, state):
        seen.append(("store", state))
        return ctx.done({"stored": sum(state["items"])})

    return agent, seen


def test_it_runs_the_steps_saving_a_checkpoint_at_each_boundary(make_agent) -> None:
    agent, seen = three_steps(make_agent)
    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.SUCCEEDED
    run = fresh(run)
    assert (run.status, run.result) == ("succeeded", {"stored": 60})
    checkpoints = list(Checkpoint.objects.filter(run=run).order_by("number"))
    assert [(c.step, c.state) for c in checkpoints] == [
        ("fetch", {}),
        ("transform", {"items": [1, 2, 3]}),
        ("store", {"items": [10, 20, 30]}),
    ]
    assert seen == [(c.step, c.state) for c in checkpoints]
    assert event_types(run.id) == [
        "run.created",
        "attempt.claimed",
        "checkpoint.saved",
        "checkpoint.saved",
        "checkpoint.saved",
        "run.succeeded",
    ]


def test_a_new_attempt_goes_on_from_the_latest_checkpoint_not_from_the_start(make_agent) -> None:
    agent = make_agent()
    calls: list[str] = []

    @agent.step
    def first(ctx, state):
        calls.append("first")
        return ctx.next("second", {"a": 1})

    @agent.step
    def second(ctx, state):
        calls.append(f"second#{ctx.attempt_number}")
        if ctx.attempt_number == 1:
            raise ConnectionError("flaky")
        return ctx.done(state)

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.FAILED
    run = fresh(run)
    assert run.status == "waiting"
    make_due(run.id)
    assert run_next(agent) == Outcome.SUCCEEDED
    assert calls == ["first", "second#1", "second#2"]
    assert fresh(run).result == {"a": 1}
    second_attempt = Attempt.objects.get(run=run, number=2)
    assert (second_attempt.reason, second_attempt.resume_from.step) == ("auto_retry", "second")


def test_the_step_gets_a_copy_of_the_state_as_it_was_saved(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def first(ctx, state):
        return ctx.next("second", {"t": (1, 2)})  # a tuple comes back as a list, as on resume

    @agent.step
    def second(ctx, state):
        return ctx.done(state)

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    assert fresh(run).result == {"t": [1, 2]}


@pytest.mark.parametrize(
    ("raised", "status", "failure_class"),
    [
        (RuntimeError("boom"), "waiting", ""),  # untyped: the policy says transient
        (ValueError("bad input"), "failed", "deterministic"),  # in non_retryable
        (Deterministic("needs a person"), "failed", "deterministic"),
        (Transient("try later"), "waiting", ""),
    ],
)
def test_it_fails_the_attempt_with_the_class_of_the_error(
    make_agent, raised, status, failure_class
) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        raise raised

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.FAILED
    run = fresh(run)
    assert (run.status, run.failure_class) == (status, failure_class)
    attempt = Attempt.objects.get(run=run, number=1)
    assert attempt.error_type == type(raised).__name__
    assert attempt.error_message == str(raised)
    assert attempt.error_step == "only"


def test_the_same_error_in_a_row_stops_with_repeated_error(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        raise TimeoutError(f"health check timed out after {ctx.attempt_number * 10}s")

    run = services.run_start(agent=agent.name, input={})
    for _ in range(3):
        assert run_next(agent) == Outcome.FAILED
        make_due(run.id)
    run = fresh(run)
    assert (run.status, run.failure_class) == ("failed", "repeated_error")
    assert Attempt.objects.filter(run=run).count() == 3


@pytest.mark.parametrize(
    ("result", "error_type"),
    [
        ("not a Next", "BadStepResult"),
        ("next-unknown", "UnknownStep"),
        ("state-not-json", "StateNotJSON"),
        ("result-not-json", "ResultNotJSON"),
    ],
)
def test_it_fails_deterministically_when_a_step_returns_something_wrong(
    make_agent, result, error_type
) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        if result == "next-unknown":
            return ctx.next("nowhere", {})
        if result == "state-not-json":
            return ctx.next("only", {"when": object()})
        if result == "result-not-json":
            return ctx.done({1, 2})
        return result

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.FAILED
    run = fresh(run)
    assert (run.status, run.failure_class) == ("failed", "deterministic")
    assert Attempt.objects.get(run=run).error_type == error_type


def test_a_resume_after_a_code_change_fails_clearly_when_the_step_is_gone(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def plan(ctx, state):
        return ctx.next("apply", {"plan": "v2"})

    @agent.step
    def apply(ctx, state):
        ctx.ask("Go?", {"go": "boolean"})
        return ctx.done()

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.INTERRUPTED
    run = fresh(run)
    request = run.pending_request
    # A new release of the agent renamed the step the checkpoint names.
    del agent.steps["apply"]
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=request.checkpoint_id,
        value={"go": 1 == 1},
    )
    assert run_next(agent) == Outcome.FAILED
    run = fresh(run)
    assert (run.status, run.failure_class) == ("failed", "deterministic")
    attempt = Attempt.objects.get(run=run, number=2)
    assert attempt.error_type == "UnknownStep"
    assert "names step 'apply'" in attempt.error_message
    assert "no longer has" in attempt.error_message
    assert request.checkpoint_id in attempt.error_message


def test_cost_adds_up_and_the_budget_stops_the_run(make_agent) -> None:
    from runs.agents import RetryPolicy

    agent = make_agent(retry=RetryPolicy(backoff_initial=0, jitter=0, cost_budget=1.0))

    @agent.step
    def first(ctx, state):
        ctx.cost("0.25")
        assert ctx.cost(0.5) == Decimal("0.75")
        return ctx.next("second", {})

    @agent.step
    def second(ctx, state):
        ctx.cost("0.5")  # 1.25 > 1.0
        return ctx.done()

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.FAILED
    run = fresh(run)
    assert (run.status, run.failure_class) == ("failed", "deterministic")
    attempt = Attempt.objects.get(run=run)
    assert attempt.error_type == "CostBudgetExceeded"
    assert attempt.cost == Decimal("1.25")
    assert run.cost == Decimal("1.25")


def test_log_lines_go_into_the_timeline(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        ctx.log("inspected config", version=3)
        ctx.log("odd value", level="warning", value={1, 2})  # not JSON: shown as text
        return ctx.done()

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    logs = events(run.id, "agent.log")
    assert [(e.payload["message"], e.payload["level"], e.payload["step"]) for e in logs] == [
        ("inspected config", "info", "only"),
        ("odd value", "warning", "only"),
    ]
    assert logs[0].payload["data"] == {"version": 3}
    assert logs[0].actor == "worker:w1"


def test_an_unknown_log_level_fails_the_step(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        ctx.log("x", level="loud")
        return ctx.done()

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.FAILED
    assert fresh(run).failure_class == "deterministic"
