"""Issue 27: a notice that one attempt is due wakes one waiting claim that may take it, not
every claim waiting in the process (runs/wakeups.py). Waking all made hundreds of claim
queries per notice at 1,000 agents and held the pool of database connections. Nothing is
lost for it: a claim that got a lease wakes the next, and a woken claim that leaves without
looking hands its wake-up on."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
from django.db import connection

from runs import services
from runs.wakeups import WorkWaiter, waiter
from tests.api.conftest import post, worker_client
from tests.runs.factory import AGENT, start
from tests.waiting import wait_for


def only(agent: str) -> Any:
    return lambda name: name == agent


@pytest.fixture
def quiet() -> WorkWaiter:
    """A waiter of its own with no listener: only what the test tells it wakes a claim."""
    own = WorkWaiter()
    own.stop()
    return own


def test_a_notice_wakes_the_oldest_claim_that_may_take_it_and_only_that_one(
    quiet: WorkWaiter,
) -> None:
    with (
        quiet.waiting(only("a")) as first,
        quiet.waiting(lambda name: True) as any_agent,
        quiet.waiting(only("a")) as third,
    ):
        quiet.wake_one("b")
        assert [t.woken for t in (first, any_agent, third)] == [False, True, False]
        quiet.wake_one("a")
        assert [t.woken for t in (first, any_agent, third)] == [True, True, False]
        quiet.wake_one("a")
        quiet.wake_one("a")  # every claim that may take it is woken: they all look anyway
        assert [t.woken for t in (first, any_agent, third)] == [True, True, True]
        quiet.looking(first)  # its look sees what woke it
        assert (first.woken, first.woken_for) == (False, None)
        quiet.wait_ticket(third, 60)  # woken since its last look: does not wait
        assert quiet.waiting_count() == 3
    assert quiet.waiting_count() == 0


def test_a_woken_claim_that_leaves_without_looking_hands_its_wake_up_on(
    quiet: WorkWaiter,
) -> None:
    leaving = quiet.waiting(only("a"))
    gone = leaving.__enter__()
    with quiet.waiting(only("a")) as staying, quiet.waiting(only("b")) as other:
        quiet.wake_one("a")
        assert (gone.woken, staying.woken) == (True, False)
        leaving.__exit__(None, None, None)  # its wait ran out, or its worker hung up
        assert (staying.woken, staying.woken_for) == (True, "a")
        assert not other.woken


def test_a_change_nobody_names_the_agent_of_wakes_every_claim(quiet: WorkWaiter) -> None:
    with quiet.waiting(only("a")) as one, quiet.waiting(only("b")) as two:
        quiet.wake()
        assert one.woken and two.woken


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_three_runs_due_at_one_notice_reach_three_waiting_claims(monkeypatch: Any) -> None:
    """Reopening an agent's gate makes its held runs due with one notice, which wakes one
    claim; each claim that gets a lease wakes the next. The claims would otherwise look
    again only after the poll interval, set here past their wait: every lease below came by
    a wake-up."""
    import api.worker_protocol

    monkeypatch.setattr(api.worker_protocol, "POLL_SECONDS", 120.0)
    got: list[Any] = []

    def claim(name: str) -> None:
        started = time.monotonic()
        try:
            answer = post(
                worker_client(name),
                "/api/worker/claim",
                {"worker_id": name, "agents": [AGENT], "wait": 60},
            )
            run_id = answer.json()["run_id"] if answer.content else None
            got.append((answer.status_code, run_id, time.monotonic() - started))
        finally:
            connection.close()

    waiter.reopen()
    services.agent_pause(agent=AGENT, reason="held while the claims line up", actor="test")
    runs = {start().id for _ in range(3)}
    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: waiter.waiting_count() == 3, 60, "three waiting claims")
        wait_for(waiter.listening.is_set, 60, "the claim listener")
        services.agent_unpause(agent=AGENT, actor="test")
        wait_for(lambda: len(got) == 3, 120, "three answers")
    finally:
        with contextlib.suppress(Exception):
            waiter.release_waiters()
            for thread in threads:
                thread.join(30)
            waiter.shutting_down.clear()
    assert sorted(status for status, _, _ in got) == [200, 200, 200], got
    assert {run_id for _, run_id, _ in got} == runs
    # A claim looks once more when its wait ends (60 s, the most there is): each lease came
    # well before that, so by a wake-up (the set-up takes seconds even at load 8).
    assert max(took for _, _, took in got) < 55, got
