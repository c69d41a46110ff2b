"""Issue 19, point 5: ``@agent.step(timeout=…, retry=…)`` and ``async def`` steps, on a
real worker (and in the harness)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest

from runs import services
from runs.models import Attempt, RunEvent
from runtime.control import AttemptControl
from runtime.executor import Outcome, execute
from runtime.sdk import RetryPolicy
from runtime.testing import run_agent
from tests.runtime.conftest import FAST_RETRY, claim, fresh, make_due, run_next

pytestmark = pytest.mark.django_db


def last_attempt(run: Any) -> Attempt:
    return (  # type: ignore[return-value]
        Attempt.objects.filter(run_id=run.id, status="failed").order_by("-number").first()
    )


def test_a_step_past_its_timeout_is_stopped_at_its_next_safe_point_and_fails_transient(
    make_agent: Any,
) -> None:
    agent = make_agent()
    laps: list[int] = []

    @agent.step(timeout=0.2)
    def poll(ctx: Any, state: Any) -> Any:
        while True:
            laps.append(1)
            # The agent cannot swallow the timeout.
            with contextlib.suppress(Exception):
                ctx.sleep(0.05)

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.FAILED
    attempt = last_attempt(run)
    assert (attempt.error_class, attempt.error_type) == ("transient", "StepTimeout")
    assert "timeout of 0.2 s" in attempt.error_message
    assert fresh(run).status == "waiting"  # backing off: a timeout is worth retrying
    assert 3 <= len(laps) <= 6


def test_a_step_within_its_timeout_is_not_stopped(make_agent: Any) -> None:
    agent = make_agent()

    @agent.step(timeout=5)
    def quick(ctx: Any, state: Any) -> Any:
        ctx.sleep(0.01)
        return ctx.done("ok")

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result == "ok"


def test_a_steps_own_retry_policy_judges_its_failures(make_agent: Any) -> None:
    agent = make_agent()  # the agent's policy: 4 attempts, ValueError non-retryable

    @agent.step(start=True)
    def sturdy(ctx: Any, state: Any) -> Any:
        if ctx.attempt_number == 1:
            raise ConnectionError("reset")
        return ctx.next("fragile", {})

    @agent.step(retry=RetryPolicy(max_attempts=2, backoff_initial=0, non_retryable=("KeyError",)))
    def fragile(ctx: Any, state: Any) -> Any:
        if ctx.attempt_number == 2:
            raise ValueError("not in this step's non_retryable: retried")
        raise KeyError("missing")

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.FAILED
    assert fresh(run).status == "waiting"  # the agent's policy: retried
    make_due(run.id)
    services.backoffs_due()
    assert run_next(agent) == Outcome.FAILED  # fragile's ValueError: transient under its policy
    assert last_attempt(run).error_class == "transient"
    assert fresh(run).status == "waiting"  # sturdy's failure is not counted against fragile
    make_due(run.id)
    services.backoffs_due()
    assert run_next(agent) == Outcome.FAILED  # KeyError: in fragile's non_retryable
    stopped = fresh(run)
    assert (stopped.status, stopped.failure_class) == ("failed", "deterministic")


def test_a_steps_own_budget_stops_the_run(make_agent: Any) -> None:
    agent = make_agent()

    @agent.step(retry=RetryPolicy(max_attempts=1))
    def once(ctx: Any, state: Any) -> Any:
        raise ConnectionError("reset")

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.FAILED
    failed = fresh(run)
    assert failed.status == "failed"
    assert "Retry budget spent (1 of 1" in failed.failure_detail
    assert agent.spec.policy_for("once").max_attempts == 1
    assert agent.spec.policy_for("other") == FAST_RETRY


def test_an_async_step_runs_on_an_event_loop_with_the_same_ctx_and_rules(
    make_agent: Any,
) -> None:
    agent = make_agent()
    threads: list[str] = []

    @agent.step(start=True)
    async def gather(ctx: Any, state: Any) -> Any:
        threads.append(threading.current_thread().name)
        sizes = await asyncio.gather(asyncio.sleep(0, 3), asyncio.sleep(0, 4))
        ctx.log("gathered", sizes=sizes)
        answer = ctx.ask("Go on?", {"go": "boolean"})
        ctx.cost("0.5")
        return ctx.next("finish", {"sizes": sizes, "go": answer["go"]})

    @agent.step
    def finish(ctx: Any, state: Any) -> Any:
        return ctx.done(state)

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.INTERRUPTED  # the hold point unwound the coroutine
    request = fresh(run).pending_request
    assert request.step_id == "gather.ask"
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=request.checkpoint_id,
        value={"go": True},
    )
    assert run_next(agent) == Outcome.SUCCEEDED
    done = fresh(run)
    assert done.result == {"sizes": [3, 4], "go": True}
    assert float(done.cost) == 0.5
    assert all(name.endswith("/loop") for name in threads)


def test_an_async_step_that_fails_or_times_out_is_classified_as_a_plain_one(
    make_agent: Any,
) -> None:
    agent = make_agent()

    @agent.step(timeout=0.1)
    async def slow(ctx: Any, state: Any) -> Any:
        await asyncio.sleep(0.3)
        ctx.check()  # the next safe point
        return ctx.done()

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.FAILED
    assert last_attempt(run).error_type == "StepTimeout"


def test_the_harness_keeps_timeouts_on_the_fake_clock_and_per_step_policies(
    make_agent: Any,
) -> None:
    agent = make_agent()

    @agent.step(start=True, timeout=60)
    async def wait(ctx: Any, state: Any) -> Any:
        ctx.sleep(30)
        if ctx.attempt_number == 1:
            ctx.sleep(45)  # past 60 s: stopped here
        return ctx.next("once", {})

    @agent.step(retry=RetryPolicy(max_attempts=1))
    def once(ctx: Any, state: Any) -> Any:
        raise ConnectionError("reset")

    run = run_agent(agent)
    assert run.attempts[0].error is not None
    assert run.attempts[0].error["type"] == "StepTimeout"
    assert run.clock.sleeps[:2] == [30, 30]  # the second sleep was cut at the deadline
    assert (run.status, run.failure_class) == ("failed", "transient")
    assert "Retry budget spent (1 of 1" in run.error["message"]


@pytest.mark.parametrize("ending", ["log", "done"])
def test_in_process_log_and_done_are_safe_points_for_the_deadline(
    make_agent: Any, ending: str
) -> None:
    """docs/agents.md: a step past its timeout is "stopped at its next safe point (any ctx
    call)": ``ctx.log`` and ``ctx.done`` included, on the run store as in the harness."""
    agent = make_agent()
    reached: list[str] = []

    @agent.step(timeout=0.1)
    def slow(ctx: Any, state: Any) -> Any:
        time.sleep(0.2)  # work that outlasts the step's timeout, without a ctx call
        if ending == "log":
            ctx.log("late")
        result = ctx.done("ok")
        reached.append(ending)
        return result

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.FAILED
    attempt = last_attempt(run)
    assert (attempt.error_class, attempt.error_type) == ("transient", "StepTimeout")
    assert reached == []
    assert not RunEvent.objects.filter(run_id=run.id, type="agent.log").exists()


def test_in_process_done_after_a_cancel_stops_there(make_agent: Any) -> None:
    agent = make_agent()
    reached: list[str] = []
    holder: dict[str, AttemptControl] = {}

    @agent.step
    def work(ctx: Any, state: Any) -> Any:
        # Cancelled mid-step; the heartbeat tells the attempt's control.
        services.run_cancel(run_id=ctx.run_id, actor="test")
        holder["control"].request_cancel("test")
        result = ctx.done("ok")
        reached.append("after done")
        return result

    services.run_start(agent=agent.name, input={})
    lease = claim(agent)
    holder["control"] = AttemptControl(lease)
    assert execute(lease, control=holder["control"], heartbeat=False) == Outcome.CANCELLED
    assert reached == []
