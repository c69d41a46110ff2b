"""Reads the runtime makes from the run store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Max

from runs.models import Attempt, InputRequest
from runs.services import Lease
from runs.states import AttemptReason, RequestStatus


@dataclass(frozen=True)
class Answer:
    """A person's answer to a hold point, as a step sees it when it runs again."""

    request_id: str
    kind: str
    step_id: str
    value: Any
    answered_by: str | None
    context: dict[str, Any]
    # What an approval showed (tool, target, change): it covers that action only.
    action: dict[str, Any] = field(default_factory=dict)


def answers_for(lease: Lease) -> dict[str, Answer]:
    """The answers that the first step of this attempt may use, by hold-point key.

    The matching rule (README, "Workers and agents"): an answer belongs to the
    checkpoint its question was asked on. A step that runs from checkpoint C gets the
    answers to the questions asked on C — the one this attempt resumes with, and any
    answered earlier on C by the same step (a step that asks twice) — but only those
    asked since the last retry by a person: a retry asks again. Once the step returns,
    the next checkpoint is saved and these answers are out of scope.
    """
    if not lease.resume_from:
        return {}
    # A person's retry starts a new line of attempts; questions asked before it are asked
    # again (an expired or denied question must not be answered by its old answer).
    line_start = (
        Attempt.objects.filter(
            run_id=lease.run_id, reason=AttemptReason.RETRY, number__lte=lease.number
        ).aggregate(n=Max("number"))["n"]
        or 0
    )
    requests = (
        InputRequest.objects.filter(
            run_id=lease.run_id,
            checkpoint_id=lease.resume_from["checkpoint_id"],
            status=RequestStatus.ANSWERED,
            attempt__number__gte=line_start,
        )
        .select_related("answered_by")
        .order_by("answered_at")
    )
    answers: dict[str, Answer] = {}
    for request in requests:
        answers[request.step_id] = Answer(
            request_id=request.id,
            kind=request.kind,
            step_id=request.step_id,
            value=request.answer,
            answered_by=request.answered_by.get_username() if request.answered_by else None,
            context=request.context or {},
            action=request.action or {},
        )
    # The lease names the request it resumes; it is on C, so it is already among them
    # unless a retry line excluded it, which cannot happen for a resume attempt.
    resumed = lease.resume_request
    if resumed and resumed.get("step_id") and resumed["step_id"] not in answers:
        answers[resumed["step_id"]] = Answer(
            request_id=resumed["request_id"],
            kind=resumed["kind"],
            step_id=resumed["step_id"],
            value=resumed["answer"],
            answered_by=resumed.get("answered_by"),
            context={},
            action=resumed.get("action") or {},
        )
    return answers


def run_cost_before(lease: Lease) -> Any:
    """What the run's earlier attempts cost, for the agent's cost budget."""
    from runs.models import Run

    return Run.objects.filter(pk=lease.run_id).values_list("cost", flat=True).first() or 0


def seconds_until_due(agents: list[str]) -> float | None:
    """Seconds until the next queued or backing-off attempt of ``agents`` may be claimed
    (0 when one is due now), or None when there is none. Served by run_claimable_idx."""
    from django.db.models import Min

    from runs.clock import db_now
    from runs.models import Run, claimable_q

    due = Run.objects.filter(claimable_q(), agent__in=agents).aggregate(due=Min("not_before"))[
        "due"
    ]
    if due is None:
        return None
    return max(0.0, (due - db_now()).total_seconds())
