"""Two people deciding one approval at once, on real PostgreSQL (issue 18).

Each race repeats 50 times with fresh runs. Two approvals of a request that needs two
count as two (never one, never three); the Nth approval racing a deny ends in exactly
one outcome, and the loser is told, changing nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from django.contrib.auth.models import User

from runs import services
from runs.approvals import parse_policy
from runs.errors import HoldpointError
from runs.models import AgentApprovalPolicy, ApprovalVote, InputRequest, RunEvent
from tests.conftest import _user
from tests.runs.factory import AGENT, interrupted
from tests.runs.test_races import ROUNDS, race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _people(*names: str) -> list[User]:
    return [_user(name, "approver") for name in names]


def _decide(run: Any, cp: Any, request: Any, user: User, value: dict[str, Any]) -> Any:
    return services.run_resume(
        run_id=run.id, request_id=request.id, checkpoint_id=cp.id, value=value, user=user
    )


def _finish(run_id: str) -> None:
    with contextlib.suppress(HoldpointError):
        services.run_cancel(run_id=run_id, reason="next round")


def test_two_approvers_at_once_count_as_two() -> None:
    alice, bob = _people("alice", "bob")
    AgentApprovalPolicy.objects.create(agent=AGENT, policy=parse_policy({"required": 2}))
    for _ in range(ROUNDS):
        run, _lease, cp, request = interrupted(kind="auth_required")
        results = race(
            lambda: _decide(run, cp, request, alice, {"decision": "approve"}),
            lambda: _decide(run, cp, request, bob, {"decision": "approve"}),
        )
        assert not any(isinstance(r, Exception) for r in results), results
        request.refresh_from_db()
        assert request.status == "answered"
        assert sorted(request.answer["approvers"]) == ["alice", "bob"]
        assert ApprovalVote.objects.filter(request=request).count() == 2
        assert RunEvent.objects.filter(run=run, type="approval.given").count() == 1
        assert RunEvent.objects.filter(run=run, type="run.resumed").count() == 1
        _finish(run.id)


def test_three_approvers_at_once_for_two_approvals_count_two_and_refuse_one() -> None:
    alice, bob, carol = _people("alice", "bob", "carol")
    AgentApprovalPolicy.objects.create(agent=AGENT, policy=parse_policy({"required": 2}))
    for _ in range(ROUNDS):
        run, _lease, cp, request = interrupted(kind="auth_required")
        results = race(
            *(
                (lambda u=u: _decide(run, cp, request, u, {"decision": "approve"}))
                for u in (alice, bob, carol)
            )
        )
        refused = [r for r in results if isinstance(r, Exception)]
        assert len(refused) == 1, results
        assert isinstance(refused[0], HoldpointError) and refused[0].code == "request_mismatch"
        request.refresh_from_db()
        assert request.status == "answered" and len(request.answer["approvers"]) == 2
        assert ApprovalVote.objects.filter(request=request).count() == 2
        _finish(run.id)


def test_the_last_approval_racing_a_deny_ends_in_exactly_one_outcome() -> None:
    alice, bob, carol = _people("alice", "bob", "carol")
    AgentApprovalPolicy.objects.create(agent=AGENT, policy=parse_policy({"required": 2}))
    outcomes = set()
    for _ in range(ROUNDS):
        run, _lease, cp, request = interrupted(kind="auth_required")
        _decide(run, cp, request, alice, {"decision": "approve"})
        approved, denied = race(
            lambda: _decide(run, cp, request, bob, {"decision": "approve"}),
            lambda: _decide(run, cp, request, carol, {"decision": "deny", "comment": "no"}),
        )
        request = InputRequest.objects.get(pk=request.id)
        assert request.status == "answered"
        winner = request.answer["decision"]
        loser = denied if winner == "approve" else approved
        assert isinstance(loser, HoldpointError) and loser.code == "request_mismatch", loser
        assert not isinstance(approved if winner == "approve" else denied, Exception)
        assert RunEvent.objects.filter(run=run, type="request.answered").count() == 1
        assert RunEvent.objects.filter(run=run, type="run.resumed").count() == 1
        # The loser's decision left no trace.
        assert ApprovalVote.objects.filter(request=request).count() == 2
        outcomes.add(winner)
        _finish(run.id)
    assert outcomes <= {"approve", "deny"}  # whichever came first, and only one of them
