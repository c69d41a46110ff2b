"""The flaky-deploy demo: retries with backoff, a deterministic stop, the repeated-error stop."""

from __future__ import annotations

from decimal import Decimal

import pytest

from runs import services
from runs.models import Attempt, Checkpoint, Run
from runtime.demo_agents.flaky_deploy import agent
from runtime.executor import Outcome
from tests.runtime.conftest import events, fresh, make_due, run_next

pytestmark = pytest.mark.django_db


def drive(run_id: str, limit: int = 10) -> list[Outcome]:
    """Run attempts until the run stops asking for more, skipping the backoff waits."""
    outcomes = []
    for _ in range(limit):
        if Run.objects.get(pk=run_id).status not in ("queued", "waiting"):
            break
        make_due(run_id)
        outcomes.append(run_next(agent))
    return outcomes


def test_transient_failures_back_off_and_then_it_succeeds() -> None:
    run = services.run_start(
        agent="flaky-deploy", input={"service": "checkout", "mode": "transient", "failures": 3}
    )
    assert run_next(agent) == Outcome.FAILED
    run = fresh(run)
    assert run.status == "waiting" and run.not_before is not None
    backing_off = events(run.id, "run.backing_off")
    assert backing_off[0].payload["delay_seconds"] > 0.5
    assert drive(run.id) == [Outcome.FAILED, Outcome.FAILED, Outcome.SUCCEEDED]
    run = fresh(run)
    assert run.status == "succeeded"
    assert run.result["rolled_out_in_attempt"] == 4
    attempts = list(Attempt.objects.filter(run=run).order_by("number"))
    assert [a.error_type for a in attempts] == [
        "ConnectionResetError",
        "TimeoutError",
        "ServiceUnavailable",
        "",
    ]
    assert all(a.reason == "auto_retry" for a in attempts[1:])
    # The build ran once: every retry went on from the checkpoint before the rollout.
    assert Checkpoint.objects.filter(run=run, step="rollout").count() == 1
    logs = [e.payload["message"] for e in events(run.id, "agent.log")]
    assert logs[0].startswith("built image checkout:")
    assert run.cost == Decimal("0.06")


def test_a_rejected_image_stops_at_once() -> None:
    run = services.run_start(
        agent="flaky-deploy", input={"service": "checkout", "mode": "deterministic"}
    )
    assert run_next(agent) == Outcome.FAILED
    run = fresh(run)
    assert (run.status, run.failure_class) == ("failed", "deterministic")
    assert "ImageRejected" in run.failure_detail


def test_the_same_error_stops_with_repeated_error_before_the_budget_is_spent() -> None:
    run = services.run_start(
        agent="flaky-deploy", input={"service": "checkout", "mode": "repeated"}
    )
    run_next(agent)
    drive(run.id)
    run = fresh(run)
    assert (run.status, run.failure_class) == ("failed", "repeated_error")
    assert Attempt.objects.filter(run=run).count() == 3 < agent.retry.max_attempts
