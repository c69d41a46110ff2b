"""Issue 24, points 3 and 6: a person who changes their mind is counted as they last
decided, and edits that come back to the plan approve the plan.

3. Approved, then denies or sends back (or objected, then approves): the second decision
   supersedes the first (``approval.changed``, kept in the history) instead of a 500 on
   the one-vote-per-person constraint. The same path sent again with the person's
   earlier Idempotency-Key answers 422 ``idempotency_key_reused`` and changes nothing.
6. 30 -> 45 -> 30: the arguments are the plan again, so the answer is a plain approval.
"""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import ApprovalVote, InputRequest, RunEvent
from tests.api.conftest import client_for
from tests.api.test_team_approvals import EDITABLE, approval, decide, pending, second_approver
from tests.runs.factory import snapshot

pytestmark = pytest.mark.django_db


def _resume_calls() -> float:
    """How many times ``run_resume`` ran in this process, whatever its outcome."""
    from runs.metrics import CONTROL_OPERATIONS

    return sum(
        sample.value
        for metric in CONTROL_OPERATIONS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels.get("operation") == "resume"
    )


def votes(request: Any) -> list[tuple[str, str, bool]]:
    """(who, decision, still counts) in the order they were given."""
    return [
        (v.user.get_username(), v.decision, v.superseded_at is None)
        for v in ApprovalVote.objects.select_related("user").filter(request=request).order_by("id")
    ]


def changes(run: Any) -> list[dict[str, Any]]:
    return list(
        RunEvent.objects.filter(run=run, type="approval.changed")
        .order_by("seq")
        .values_list("payload", flat=True)
    )


@pytest.mark.parametrize(
    ("second", "answer"),
    [
        ({"decision": "deny", "comment": "saw the diff again"}, "deny"),
        ({"decision": "respond", "comment": "keep v2 too"}, "respond"),
    ],
)
def test_an_approver_who_changes_their_mind_decides_the_request(
    approver, second: dict[str, Any], answer: str
) -> None:
    run, cp, request = approval({"required": 2})
    first = decide(approver, run, cp, request, {"decision": "approve", "comment": "ok"}, "a1")
    assert first.status_code == 202, first.json()
    response = decide(approver, run, cp, request, second, "a2")
    assert response.status_code == 202, response.json()
    request.refresh_from_db()
    assert request.status == "answered"
    assert request.answer == second
    assert votes(request) == [("alice", "approve", False), ("alice", answer, True)]
    (changed,) = changes(run)
    assert changed["by"] == "alice" and (changed["from"], changed["to"]) == ("approve", answer)
    assert changed["comment"] == second["comment"] and changed["earlier_comment"] == "ok"
    shown = client_for(approver).get(f"/api/runs/{run.pk}").json()
    assert shown["status"] == "queued"  # resumed with the answer, in a new attempt


def test_an_objection_changed_to_an_approval_counts_as_one(approver) -> None:
    run, cp, request = approval({"required": 2, "any_deny_closes": False})
    assert (
        decide(approver, run, cp, request, {"decision": "deny", "comment": "?"}, "o1").status_code
        == 202
    )
    assert decide(approver, run, cp, request, {"decision": "approve"}, "o2").status_code == 202
    request.refresh_from_db()
    assert request.status == "pending"
    assert votes(request) == [("alice", "deny", False), ("alice", "approve", True)]
    facts = pending(run, approver)
    assert facts["approvals_needed"] == 1
    assert [(a["by"], a["decision"], a["counts"]) for a in facts["approvals"]] == [
        ("alice", "deny", False),
        ("alice", "approve", True),
    ]
    # A second approval by the same person is still refused; another person completes it.
    again = decide(approver, run, cp, request, {"decision": "approve"}, "o3")
    assert again.status_code == 403 and again.json()["reason"] == "already_approved"
    bob = second_approver()
    assert decide(bob, run, cp, request, {"decision": "approve"}, "b1").status_code == 202
    request.refresh_from_db()
    assert request.status == "answered"
    assert request.answer["approvers"] == ["alice", "bob"]


def test_the_earlier_key_with_another_decision_is_refused_and_changes_nothing(approver) -> None:
    run, cp, request = approval({"required": 2})
    assert (
        decide(approver, run, cp, request, {"decision": "approve"}, "same-key").status_code == 202
    )
    before = snapshot(run.pk)
    resumes = _resume_calls()
    response = decide(
        approver, run, cp, request, {"decision": "deny", "comment": "changed"}, "same-key"
    )
    assert response.status_code == 422, response.json()
    assert response["Content-Type"].startswith("application/problem+json")
    assert response.json()["code"] == "idempotency_key_reused"
    assert snapshot(run.pk) == before
    assert votes(InputRequest.objects.get(pk=request.id)) == [("alice", "approve", True)]
    # The key was checked before the service: it never ran for the refused request.
    assert _resume_calls() == resumes
    # The same request with the same key replays the first answer.
    replay = decide(approver, run, cp, request, {"decision": "approve"}, "same-key")
    assert replay.status_code == 202 and replay["Idempotent-Replayed"] == "true"


def test_edits_that_come_back_to_the_plan_approve_the_plan(approver) -> None:
    """Two approvals needed. bob edits the ttl 3600 -> 45 and approves; alice edits it back
    to 3600 and approves (a new round: bob approved other arguments); carol approves.
    What is approved is the plan: the answer carries no edit, so the step runs the plan
    under the plan's key, not an "edit" equal to it under an edit's key."""
    run, cp, request = approval({"required": 2}, editable=EDITABLE)
    plan = EDITABLE["value"]
    bob, carol = second_approver(), second_approver("carol")
    first = decide(
        bob, run, cp, request, {"decision": "approve", "edited": {**plan, "ttl": 45}}, "e1"
    )
    assert first.status_code == 202
    back = decide(approver, run, cp, request, {"decision": "approve", "edited": {**plan}}, "e2")
    assert back.status_code == 202
    request.refresh_from_db()
    assert request.status == "pending" and request.edited == plan
    assert decide(carol, run, cp, request, {"decision": "approve"}, "e3").status_code == 202
    request.refresh_from_db()
    assert request.status == "answered"
    assert request.answer == {"decision": "approve", "approvers": ["alice", "carol"]}
    answered = RunEvent.objects.get(run=run, type="request.answered").payload
    assert "original" not in answered and "edited_by" not in answered
