"""The worker pool in threads of this process, on a committed database (SQLite or PostgreSQL):
claims, heartbeats, wake-ups, cancel signals, graceful stop."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from django.db import connection

from runs import services
from runs.models import Attempt, Run, RunEvent
from runtime.control import AttemptControl
from runtime.executor import Outcome, execute
from runtime.worker import WorkerPool
from tests.runtime.conftest import claim, fresh
from tests.waiting import timed_wait, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def status(run_id: str) -> str:
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).get()


@pytest.fixture
def pools() -> Iterator[Callable[..., WorkerPool]]:
    started: list[WorkerPool] = []

    def start(*args, **kwargs) -> WorkerPool:
        kwargs.setdefault("sweep_interval", 0.2)
        pool = WorkerPool(*args, **kwargs).start()
        started.append(pool)
        return pool

    yield start
    for pool in started:
        pool.stop(timeout=5)


def test_a_pool_runs_many_runs_each_attempt_on_one_worker(make_agent, pools) -> None:
    agent = make_agent()

    @agent.step
    def one(ctx, state):
        time.sleep(0.01)
        return ctx.next("two", {"n": ctx.input["n"]})

    @agent.step
    def two(ctx, state):
        if ctx.input["n"] % 4 == 0 and ctx.attempt_number == 1:
            raise ConnectionError("flaky network")  # some go through a retry
        return ctx.done(state["n"] * 2)

    run_ids = [services.run_start(agent=agent.name, input={"n": n}).id for n in range(12)]
    pools(3, [agent.name], lease_seconds=5)
    wait_for(
        lambda: Run.objects.filter(pk__in=run_ids, status="succeeded").count() == 12,
        30,
        "every run to succeed",
    )
    results = dict(Run.objects.filter(pk__in=run_ids).values_list("id", "result"))
    assert results == {rid: n * 2 for n, rid in enumerate(run_ids)}
    claims = Counter(
        e.payload["attempt_id"] for e in RunEvent.objects.filter(type="attempt.claimed")
    )
    assert set(claims.values()) == {1}
    assert len({w for w in Attempt.objects.values_list("worker_id", flat=True)}) > 1


def test_an_idle_worker_wakes_at_once_when_work_arrives(make_agent, pools) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        return ctx.done("ok")

    pool = pools(1, [agent.name], poll_interval=30)
    time.sleep(0.3)  # the worker found nothing and is waiting
    run = services.run_start(agent=agent.name, input={})
    took = timed_wait(lambda: status(run.id) == "succeeded", 5, "the run to succeed")
    assert took < 1.0
    assert pool.poll_interval == 30


def test_the_heartbeat_keeps_a_long_step_alive_and_reports_its_cost(make_agent, pools) -> None:
    agent = make_agent()

    @agent.step
    def long(ctx, state):
        ctx.cost("0.5")
        time.sleep(1.5)  # three leases long, without a single ctx call
        return ctx.done("finished")

    run = services.run_start(agent=agent.name, input={})
    pools(1, [agent.name], lease_seconds=0.5, sweep_interval=0.1)
    wait_for(lambda: status(run.id) == "succeeded", 10, "the run to succeed")
    (attempt,) = Attempt.objects.filter(run_id=run.id)
    assert attempt.status == "succeeded"
    assert attempt.last_heartbeat_at > attempt.started_at
    assert fresh(run).cost == attempt.cost == 0.5


def test_a_cancel_reaches_the_worker_at_once_not_at_its_next_heartbeat(make_agent, pools) -> None:
    agent = make_agent()
    entered = threading.Event()

    @agent.step
    def wait(ctx, state):
        entered.set()
        ctx.sleep(60)
        return ctx.done("slept")

    run = services.run_start(agent=agent.name, input={})
    pools(1, [agent.name], lease_seconds=30)  # heartbeats every 10 s
    assert entered.wait(5)
    services.run_cancel(run_id=run.id, reason="stop now")
    took = timed_wait(lambda: status(run.id) == "cancelled", 5, "the run to be cancelled")
    assert took < 1.0
    assert Attempt.objects.get(run_id=run.id).status == "aborted"


def test_the_heartbeat_delivers_a_cancel_when_no_signal_does(make_agent) -> None:
    agent = make_agent()
    entered = threading.Event()

    @agent.step
    def wait(ctx, state):
        entered.set()
        ctx.sleep(60)
        return ctx.done("slept")

    run = services.run_start(agent=agent.name, input={})
    lease = claim(agent, lease_seconds=0.9)  # heartbeats every 0.3 s
    outcome: list[Outcome] = []

    def work() -> None:
        try:
            outcome.append(execute(lease, control=AttemptControl(lease)))
        finally:
            connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    assert entered.wait(5)
    services.run_cancel(run_id=run.id)
    thread.join(5)
    assert outcome == [Outcome.CANCELLED]
    assert status(run.id) == "cancelled"


def test_stop_lets_the_step_finish_and_hands_the_attempt_on(make_agent, pools) -> None:
    agent = make_agent()
    entered = threading.Event()

    @agent.step
    def first(ctx, state):
        entered.set()
        time.sleep(0.5)
        return ctx.next("second", {"first": ctx.attempt_number})

    @agent.step
    def second(ctx, state):
        return ctx.done(state)

    run = services.run_start(agent=agent.name, input={})
    pool = pools(1, [agent.name], lease_seconds=10)
    assert entered.wait(5)
    pool.stop(timeout=5)
    run = fresh(run)
    assert run.status == "queued"
    first_attempt, second_attempt = Attempt.objects.filter(run=run).order_by("number")
    assert first_attempt.status == "aborted"
    assert second_attempt.resume_from.step == "second"
    pools(1, [agent.name])
    wait_for(lambda: status(run.id) == "succeeded", 5, "another worker to finish the run")
    assert fresh(run).result == {"first": 1}


def test_a_stop_that_cannot_wait_releases_the_lease_and_fences_the_step(make_agent, pools) -> None:
    agent = make_agent()
    entered, finished = threading.Event(), threading.Event()

    @agent.step
    def first(ctx, state):
        entered.set()
        time.sleep(1.0)
        try:
            return ctx.next("second", {})
        finally:
            finished.set()

    @agent.step
    def second(ctx, state):
        return ctx.done()

    run = services.run_start(agent=agent.name, input={})
    pool = pools(1, [agent.name], lease_seconds=10)
    assert entered.wait(5)
    pool.stop(timeout=0.1)
    assert status(run.id) == "queued"  # released at once, another worker may go on
    assert finished.wait(5)
    time.sleep(0.2)
    assert not Attempt.objects.filter(run_id=run.id, checkpoints__step="second").exists()
    assert Attempt.objects.get(run_id=run.id, number=1).status == "aborted"


def test_a_pool_refuses_agents_it_does_not_have() -> None:
    with pytest.raises(ValueError, match="No agent named nope"):
        WorkerPool(1, ["nope"])


def test_sweeps_run_in_every_pool(make_agent, pools) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        return ctx.done()

    run = services.run_start(agent=agent.name, input={})
    claim(agent, "dead-worker", lease_seconds=0.2)  # a worker that died after claiming
    pools(1, [agent.name], sweep_interval=0.1)
    wait_for(lambda: status(run.id) == "succeeded", 5, "the sweep and a new attempt")
    first = Attempt.objects.get(run_id=run.id, number=1)
    second = Attempt.objects.get(run_id=run.id, number=2)
    assert (first.status, second.reason) == ("lost", "lease_expired")


def test_an_idle_worker_wakes_when_a_backoff_comes_due(make_agent, pools) -> None:
    from runs.agents import RetryPolicy

    agent = make_agent(retry=RetryPolicy(backoff_initial=0.6, jitter=0.0))

    @agent.step
    def only(ctx, state):
        if ctx.attempt_number == 1:
            raise ConnectionError("try again shortly")
        return ctx.done(ctx.attempt_number)

    run = services.run_start(agent=agent.name, input={})
    # No sweeper and a long poll: only the due time itself can wake the worker.
    pools(1, [agent.name], poll_interval=30, sweep=False)
    wait_for(lambda: status(run.id) == "succeeded", 5, "the retry after the backoff")
    first, second = Attempt.objects.filter(run_id=run.id).order_by("number")
    waited = (second.started_at - first.ended_at).total_seconds()
    assert 0.5 < waited < 1.5
