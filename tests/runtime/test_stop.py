"""How an attempt stops: a lost lease (abandon, write nothing), a cancel (acknowledge), a
shutdown (finish the step, hand the attempt on). Single-threaded: the step itself plays
the other worker or the person, through the real services."""

from __future__ import annotations

import time

import pytest

from runs import services
from runs.models import Attempt, Checkpoint
from runtime.control import AttemptControl
from runtime.executor import Outcome, execute
from tests.runtime.conftest import claim, event_types, events, expire_lease, fresh, run_next

pytestmark = pytest.mark.django_db


def take_over(agent, run_id: str) -> str:
    """Another worker takes the run: the lease runs out, the sweep requeues, w2 claims."""
    expire_lease(run_id)
    assert services.leases_expire() == 1
    return claim(agent, "w2").attempt_id


@pytest.mark.parametrize("next_write", ["checkpoint", "log", "complete", "ask"])
def test_a_worker_whose_lease_was_taken_abandons_without_writing(make_agent, next_write) -> None:
    agent = make_agent()
    taken: list[str] = []

    @agent.step
    def first(ctx, state):
        return ctx.next("slow", {"n": 1})

    @agent.step
    def slow(ctx, state):
        taken.append(take_over(agent, ctx.run_id))
        if next_write == "log":
            ctx.log("still here")
        if next_write == "complete":
            return ctx.done("late result")
        if next_write == "ask":
            ctx.ask("Late question?", {"x": "string"})
        return ctx.next("after", {"n": 2})

    @agent.step
    def after(ctx, state):
        return ctx.done("never")

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent, "w1") == Outcome.ABANDONED
    run = fresh(run)
    # The run belongs to w2's attempt, untouched by w1 after the takeover.
    assert run.status == "running"
    assert run.current_attempt_id == taken[0]
    assert run.result is None and run.pending_request is None
    assert [c.step for c in Checkpoint.objects.filter(run=run).order_by("number")] == [
        "first",
        "slow",
    ]
    assert Attempt.objects.get(run=run, number=1).status == "lost"
    assert events(run.id, "agent.log") == []
    assert event_types(run.id)[-1] == "attempt.claimed"


def test_a_write_refused_after_a_cancel_is_acknowledged_and_changes_nothing(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def first(ctx, state):
        return ctx.next("second", {})

    @agent.step
    def second(ctx, state):
        services.run_cancel(run_id=ctx.run_id, reason="wrong target")
        # A step that does not look: it returns as if nothing happened.
        return ctx.next("third", {"did": "more"})

    @agent.step
    def third(ctx, state):
        return ctx.done()

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.CANCELLED
    run = fresh(run)
    assert (run.status, run.failure_class) == ("cancelled", "cancelled")
    assert Attempt.objects.get(run=run).status == "aborted"
    types = event_types(run.id)
    after_cancel = types[types.index("run.cancel_requested") :]
    assert after_cancel == ["run.cancel_requested", "run.cancelled"]
    assert Checkpoint.objects.filter(run=run, step="third").count() == 0


def test_a_cancel_signal_wakes_a_sleeping_step_at_once(make_agent) -> None:
    agent = make_agent()
    holder: dict[str, AttemptControl] = {}

    @agent.step
    def wait(ctx, state):
        services.run_cancel(run_id=ctx.run_id)
        holder["control"].request_cancel("test")  # what the listener does on NOTIFY
        ctx.sleep(30)
        return ctx.done("slept")

    services.run_start(agent=agent.name, input={})
    lease = claim(agent)
    holder["control"] = AttemptControl(lease)
    started = time.monotonic()
    assert execute(lease, control=holder["control"], heartbeat=False) == Outcome.CANCELLED
    assert time.monotonic() - started < 2


def test_shutdown_finishes_the_step_then_hands_the_attempt_on(make_agent) -> None:
    agent = make_agent()
    holder: dict[str, AttemptControl] = {}

    @agent.step
    def first(ctx, state):
        holder["control"].shutdown.set()  # SIGTERM arrives while the step runs
        return ctx.next("second", {"first": "done"})

    @agent.step
    def second(ctx, state):
        return ctx.done(state)

    run = services.run_start(agent=agent.name, input={})
    lease = claim(agent)
    holder["control"] = AttemptControl(lease)
    assert execute(lease, control=holder["control"], heartbeat=False) == Outcome.RELEASED
    run = fresh(run)
    assert run.status == "queued"
    first_attempt, second_attempt = Attempt.objects.filter(run=run).order_by("number")
    assert (first_attempt.status, first_attempt.error_message) == ("aborted", "released: shutdown")
    assert second_attempt.reason == "released"  # a hand-over, not a lost lease
    assert second_attempt.resume_from.step == "second"
    assert second_attempt.resume_from.state == {"first": "done"}
    assert run_next(agent, "w2") == Outcome.SUCCEEDED
    assert fresh(run).result == {"first": "done"}
