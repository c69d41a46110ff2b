"""Reads the runtime makes from the run store."""

from __future__ import annotations

from holdpoint_client.backend import Answer

from runs.selectors import answers_for_lease
from runs.services import Lease


def answers_for(lease: Lease) -> dict[str, Answer]:
    """The answers that the first step of this attempt may use, by hold-point key (the
    matching rule: ``runs.selectors.answers_for_lease``, the same the worker API's lease
    carries)."""
    return {
        record["step_id"]: Answer(
            request_id=record["request_id"],
            kind=record["kind"],
            step_id=record["step_id"],
            value=record["answer"],
            answered_by=record["answered_by"],
            context=record["context"],
            action=record["action"],
        )
        for record in answers_for_lease(lease)
    }


def seconds_until_due(agents: list[str]) -> float | None:
    """Seconds until the next queued or backing-off attempt of ``agents`` may be claimed
    (0 when one is due now), or None when there is none. Served by run_claimable_idx."""
    from django.db.models import Min

    from runs.db import db_now
    from runs.models import Run, claimable_q

    # claimable_q leaves out the runs of a paused agent: however old, they are not due, and
    # idle workers must not spin on them.
    due = Run.objects.filter(claimable_q(), agent__in=agents).aggregate(due=Min("not_before"))[
        "due"
    ]
    if due is None:
        return None
    return max(0.0, (due - db_now()).total_seconds())
