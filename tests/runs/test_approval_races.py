"""Two people deciding one approval at once, on real PostgreSQL (issue 18).

Each race repeats 50 times with fresh runs (25 for each case of a parametrised one). Two
approvals of a request that needs two count as two (never one, never three); the Nth
approval racing a deny, or a send-back, ends in exactly one outcome, and the loser is
told, changing nothing; an edit racing an approval ends as one of the two orders, and no
approval counts for arguments its approver did not approve; the person who started the
run never counts where the policy forbids it, whoever comes first.
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


def _votes(request: Any) -> list[tuple[str, str, int, Any]]:
    """Every decision recorded on ``request``, in the order they took the run's lock."""
    return [
        (v.user.get_username(), v.decision, v.round, v.edited)
        for v in ApprovalVote.objects.select_related("user").filter(request=request).order_by("id")
    ]


def _events(run: Any, kind: str) -> list[dict[str, Any]]:
    return list(
        RunEvent.objects.filter(run=run, type=kind)
        .order_by("seq")
        .values_list("payload", flat=True)
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


PLAN = {"accepted_versions": ["v2", "v3"], "ttl": 3600}
EDIT = {"accepted_versions": ["v3"], "ttl": 60}


def _editable_approval() -> tuple[Any, Any, Any, Any]:
    return interrupted(
        kind="auth_required",
        action={
            "tool": "config_store",
            "target": "staging/auth/config",
            "reversibility": "reversible",
            "editable": {
                "schema": {"accepted_versions": "string[]", "ttl": "integer"},
                "value": PLAN,
            },
        },
    )


@pytest.mark.parametrize("form", ["api", "dashboard"])
def test_an_edit_racing_an_approval_ends_in_one_order_and_counts_no_approval_of_other_arguments(
    form: str,
) -> None:
    """Two approvals needed; alice approved the plan. Bob approves with an edit while carol
    approves: over the API without ``edited`` (it approves "the arguments on the table",
    docs/api.md), or as the dashboard sends it, with the arguments her form showed (the plan).

    The legal orders: carol first, her approval is the second of the plan: approved as
    planned by alice and carol, and bob is told ``request_mismatch``. Bob first, his edit
    resets alice's approval (round 1, one of two); then carol's API approval approves the
    edit on the table (approved as edited by bob and carol, alice not counted), while her
    dashboard approval of the plan is itself an edit back to the plan (round 2, resetting
    bob; still pending, one of two).

    How this fails: if the second decision read the request (its round, its edit) before
    the first committed, or the run lock did not serialise them, the reset is lost: the
    request is approved with bob's edit and alice (who approved the plan) among its
    approvers, or approved as planned with bob's edit counted, or both write round-1
    votes; any of these matches none of the orders below, nor the invariant after them.
    """
    alice, bob, carol = _people("alice", "bob", "carol")
    AgentApprovalPolicy.objects.create(agent=AGENT, policy=parse_policy({"required": 2}))
    carols: dict[str, Any] = {"decision": "approve"}
    if form == "dashboard":
        carols["edited"] = PLAN
    outcomes = set()
    for _ in range(ROUNDS // 2):
        # What each person approved (carol over the API: whatever is on the table when her
        # approval takes the lock, by the API's definition; set below).
        saw = {"alice": PLAN, "bob": EDIT, "carol": PLAN}
        run, _lease, cp, request = _editable_approval()
        _decide(run, cp, request, alice, {"decision": "approve"})
        edited, approved = race(
            lambda: _decide(run, cp, request, bob, {"decision": "approve", "edited": EDIT}),
            lambda: _decide(run, cp, request, carol, carols),
        )
        assert not isinstance(approved, Exception), approved
        request = InputRequest.objects.get(pk=request.id)
        votes = _votes(request)
        given = [(e["by"], e["approvals"], e["reset"]) for e in _events(run, "approval.given")]
        answered = _events(run, "request.answered")
        if isinstance(edited, Exception):
            # Carol first: the plan had its two approvals before bob's edit arrived.
            assert isinstance(edited, HoldpointError) and edited.code == "request_mismatch"
            assert request.status == "answered"
            assert request.answer == {"decision": "approve", "approvers": ["alice", "carol"]}
            assert votes == [("alice", "approve", 0, None), ("carol", "approve", 0, None)]
            assert given == [("alice", 1, False)]
            outcome = "approved as planned"
        elif form == "api":
            # Bob first; carol's approval without edited approves the edit on the table.
            assert request.status == "answered"
            assert request.answer == {
                "decision": "approve",
                "edited": EDIT,
                "approvers": ["bob", "carol"],
            }
            assert votes == [
                ("alice", "approve", 0, None),
                ("bob", "approve", 1, EDIT),
                ("carol", "approve", 1, None),
            ]
            assert given == [("alice", 1, False), ("bob", 1, True)]
            assert answered[0]["original"] == PLAN and answered[0]["edited_by"] == "bob"
            saw["carol"] = EDIT
            outcome = "approved as edited"
        else:
            # Bob first; carol's form approved the plan, which is now an edit back to it.
            assert request.status == "pending"
            assert (request.edit_round, request.edited) == (2, PLAN)
            assert votes == [
                ("alice", "approve", 0, None),
                ("bob", "approve", 1, EDIT),
                ("carol", "approve", 2, PLAN),
            ]
            assert given == [("alice", 1, False), ("bob", 1, True), ("carol", 1, True)]
            outcome = "edited back, waiting"
        # Whatever the order: every approval that counts approved what the request holds.
        on_the_table = request.edited if request.edited is not None else PLAN
        counted = [who for who, _d, rnd, _e in votes if rnd == request.edit_round]
        assert counted and all(saw[who] == on_the_table for who in counted), (votes, saw)
        if request.status == "answered":
            assert request.answer.get("edited", PLAN) == on_the_table
            assert request.answer["approvers"] == counted
        done = 1 if request.status == "answered" else 0
        assert len(answered) == done
        assert RunEvent.objects.filter(run=run, type="run.resumed").count() == done
        run.refresh_from_db()
        assert run.status == ("queued" if done else "auth_required")
        outcomes.add(outcome)
        _finish(run.id)
    assert outcomes <= {"approved as planned", "approved as edited", "edited back, waiting"}


def test_a_send_back_racing_the_last_approval_ends_in_exactly_one_outcome() -> None:
    """Two approvals needed; alice approved. Bob approves (the second) while carol sends it
    back with a comment (``respond``): exactly one answers the request, the other is told
    ``request_mismatch`` (409, docs/api.md) naming who answered, and the request, its votes
    and the run's events are the winner's alone.

    How this fails: without the run lock both read a pending request and both answer it:
    two ``request.answered`` / ``run.resumed`` events and two resume attempts, or the
    answer of one with the other's vote recorded beside it, or both callers told success.
    """
    alice, bob, carol = _people("alice", "bob", "carol")
    AgentApprovalPolicy.objects.create(agent=AGENT, policy=parse_policy({"required": 2}))
    sent_back = {"decision": "respond", "comment": "re-plan: keep v1 a week longer"}
    outcomes = set()
    for _ in range(ROUNDS // 2):
        run, _lease, cp, request = interrupted(kind="auth_required")
        _decide(run, cp, request, alice, {"decision": "approve"})
        approved, responded = race(
            lambda: _decide(run, cp, request, bob, {"decision": "approve"}),
            lambda: _decide(run, cp, request, carol, sent_back),
        )
        request = InputRequest.objects.select_related("answered_by").get(pk=request.id)
        assert request.status == "answered"
        winner = request.answer["decision"]
        lost, won = (responded, approved) if winner == "approve" else (approved, responded)
        assert not isinstance(won, Exception), won
        assert isinstance(lost, HoldpointError) and lost.code == "request_mismatch", lost
        votes = _votes(request)
        if winner == "approve":
            assert request.answer == {"decision": "approve", "approvers": ["alice", "bob"]}
            assert request.answered_by == bob
            assert votes == [("alice", "approve", 0, None), ("bob", "approve", 0, None)]
            assert "Already answered by bob" in lost.detail
        else:
            assert request.answer == {"decision": "respond", "comment": sent_back["comment"]}
            assert request.answered_by == carol
            assert votes == [("alice", "approve", 0, None), ("carol", "respond", 0, None)]
            assert "Already answered by carol" in lost.detail
        answered = _events(run, "request.answered")
        assert [e["answer"] for e in answered] == [request.answer]
        assert RunEvent.objects.filter(run=run, type="run.resumed").count() == 1
        assert [e["by"] for e in _events(run, "approval.given")] == ["alice"]
        assert run.attempts.count() == 2  # the first, and one resume
        outcomes.add(winner)
        _finish(run.id)
    assert outcomes <= {"approve", "respond"}


def test_the_runs_starter_never_counts_under_no_self_approval_whoever_comes_first() -> None:
    """``self_approval: false``, two approvals needed; carol approved. Sam, who started the
    run (an approver himself), approves at the same moment as bob. Sam's approval never
    counts: first, he is refused ``approval_not_allowed`` (reason ``self_approval``) and
    bob's is the second; second, he finds it answered (``request_mismatch``). Either way
    the approvers are carol and bob and sam left no vote.

    How this fails: if the rule were checked on a request or run read outside the lock,
    or skipped for an approval that completes the count, sam's vote would be recorded,
    and first in line it would be the second approval: approved by carol and sam, with
    bob refused.
    """
    sam, bob, carol = _people("sam", "bob", "carol")
    AgentApprovalPolicy.objects.create(
        agent=AGENT, policy=parse_policy({"required": 2, "self_approval": False})
    )
    outcomes = set()
    for _ in range(ROUNDS // 2):
        run, _lease, cp, request = interrupted(kind="auth_required", started_by=sam)
        assert run.created_by == sam and request.policy["self_approval"] is False
        _decide(run, cp, request, carol, {"decision": "approve"})
        by_sam, by_bob = race(
            lambda: _decide(run, cp, request, sam, {"decision": "approve"}),
            lambda: _decide(run, cp, request, bob, {"decision": "approve"}),
        )
        assert not isinstance(by_bob, Exception), by_bob
        assert isinstance(by_sam, HoldpointError), by_sam
        if by_sam.code == "approval_not_allowed":
            assert by_sam.extra["reason"] == "self_approval"
            outcomes.add("refused first")
        else:
            assert by_sam.code == "request_mismatch", by_sam
            outcomes.add("too late")
        request = InputRequest.objects.get(pk=request.id)
        assert request.status == "answered"
        assert request.answer == {"decision": "approve", "approvers": ["carol", "bob"]}
        assert _votes(request) == [("carol", "approve", 0, None), ("bob", "approve", 0, None)]
        assert [e["by"] for e in _events(run, "approval.given")] == ["carol"]
        assert RunEvent.objects.filter(run=run, type="run.resumed").count() == 1
        _finish(run.id)
    assert outcomes <= {"refused first", "too late"}


def _standing(request: Any) -> list[tuple[str, str]]:
    """The decisions that count, in lock order: (who, decision)."""
    return [
        (v.user.get_username(), v.decision)
        for v in ApprovalVote.objects.select_related("user")
        .filter(request=request, superseded_at__isnull=True)
        .order_by("id")
    ]


def test_a_change_of_mind_racing_the_last_approval_ends_in_exactly_one_outcome() -> None:
    """Issue 24, point 3: two approvals needed; alice approved. Alice changes her mind
    (deny, which closes) at the moment bob gives the last approval. Either order is
    legal, and each ends whole: bob first, the request is approved by alice and bob and
    alice is told it was already answered; alice first, her approval is superseded by
    her deny, the request is denied, and bob is told. Never a 500 (the one-vote-per-person
    constraint), never a request left pending with a deny that did not close it.

    How this fails: without the change of mind, alice's second vote hits the unique
    constraint (IntegrityError, a 500) and the request stays pending with her approval.
    """
    alice, bob = _people("alice", "bob")
    AgentApprovalPolicy.objects.create(agent=AGENT, policy=parse_policy({"required": 2}))
    outcomes = set()
    for _ in range(ROUNDS):
        run, _lease, cp, request = interrupted(kind="auth_required")
        _decide(run, cp, request, alice, {"decision": "approve", "comment": "looks fine"})
        by_alice, by_bob = race(
            lambda: _decide(run, cp, request, alice, {"decision": "deny", "comment": "wait"}),
            lambda: _decide(run, cp, request, bob, {"decision": "approve"}),
        )
        request = InputRequest.objects.get(pk=request.id)
        assert request.status == "answered", (by_alice, by_bob)
        winner = request.answer["decision"]
        if winner == "approve":
            assert not isinstance(by_bob, Exception), by_bob
            assert isinstance(by_alice, HoldpointError) and by_alice.code == "request_mismatch"
            assert request.answer == {"decision": "approve", "approvers": ["alice", "bob"]}
            assert _standing(request) == [("alice", "approve"), ("bob", "approve")]
            assert _events(run, "approval.changed") == []
        else:
            assert winner == "deny"
            assert not isinstance(by_alice, Exception), by_alice
            assert isinstance(by_bob, HoldpointError) and by_bob.code == "request_mismatch"
            assert request.answer == {"decision": "deny", "comment": "wait"}
            assert request.answered_by == alice
            assert _standing(request) == [("alice", "deny")]
            # Her approval stays in the history, superseded.
            assert _votes(request) == [("alice", "approve", 0, None), ("alice", "deny", 0, None)]
            (changed,) = _events(run, "approval.changed")
            assert (changed["by"], changed["from"], changed["to"]) == ("alice", "approve", "deny")
        assert RunEvent.objects.filter(run=run, type="request.answered").count() == 1
        assert RunEvent.objects.filter(run=run, type="run.resumed").count() == 1
        outcomes.add(winner)
        _finish(run.id)
    assert outcomes <= {"approve", "deny"}
