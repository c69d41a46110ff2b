"""Helpers for runtime tests: throwaway agents and running attempts in this thread."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.utils import timezone

from runs import services
from runs.models import Attempt, Run, RunEvent
from runs.services import Lease
from runtime.executor import Outcome, execute
from runtime.sdk import Agent, RetryPolicy

_names = itertools.count(1)

FAST_RETRY = RetryPolicy(
    max_attempts=4,
    backoff_initial=0.0,
    jitter=0.0,
    non_retryable=("ValueError",),
    repeated_error_threshold=3,
    max_lease_losses=2,
)


@pytest.fixture
def make_agent() -> Iterator[Callable[..., Agent]]:
    """Create agents with unique names, unregistered after the test."""
    made: list[Agent] = []

    def make(**kwargs: Any) -> Agent:
        kwargs.setdefault("name", f"t-agent-{next(_names)}")
        kwargs.setdefault("retry", FAST_RETRY)
        agent = Agent(**kwargs)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent.unregister()


def claim(agent: Agent, worker: str = "w1", lease_seconds: float | None = 30) -> Lease:
    lease = services.attempt_claim(
        worker_id=worker, agents=[agent.name], lease_seconds=lease_seconds
    )
    assert lease is not None, "expected a due attempt"
    return lease


def run_next(agent: Agent, worker: str = "w1", **kwargs: Any) -> Outcome:
    """Claim the next due attempt of ``agent`` and run it here, without a heartbeat thread
    (the test's transaction is not visible to other connections)."""
    return execute(claim(agent, worker), heartbeat=False, **kwargs)


def make_due(run_id: str) -> None:
    """Let a backing-off run be claimed now (the DB clock ignores time_machine)."""
    Run.objects.filter(pk=run_id).update(not_before=timezone.now() - dt.timedelta(seconds=1))


def expire_lease(run_id: str) -> None:
    Attempt.objects.filter(run_id=run_id, status="running").update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )


def events(run_id: str, type: str | None = None) -> list[RunEvent]:
    qs = RunEvent.objects.filter(run_id=run_id).order_by("seq")
    if type:
        qs = qs.filter(type=type)
    return list(qs)


def event_types(run_id: str) -> list[str]:
    return [e.type for e in events(run_id)]


def fresh(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)
