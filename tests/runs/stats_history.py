"""A history with known figures for the operations page (runs/stats.py): the tests of the
figures, of the API and of the page all read the same one.

Times are relative to the real clock (the page reads it), and every row sits well inside
or well outside the windows whatever the minute: the 24-hour window starts between 23 and
24 hours ago, the 7-day one between 6 and 7 days ago.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.utils import timezone

from runs.models import Attempt, InputRequest, Run, Worker
from runs.stats import stats_rollup

ALPHA = "alpha"
# Untrusted text: an agent's name reaches the page; it must show as text, never as markup.
BETA = "beta<i>x</i>"

# The figures the history below must give (docs: tests/runs/test_stats.py asserts them).
OPEN = {(ALPHA, "input_required"): 2, (BETA, "auth_required"): 1}
RUNS_24H = {"succeeded": 5, "failed": 2}
RUNS_7D = {"succeeded": 5, "failed": 2, "cancelled": 1}
COST_24H = {ALPHA: (Decimal("1.75"), 4), BETA: (Decimal("2"), 3)}
FAILURES_24H = {"transient": 2, "deterministic": 1, "denied": 1, "lease_lost": 1}
# Seconds to answer: alpha [60, 180], beta [120, 300, 600] (percentile_cont).
ANSWER_BY_AGENT = {ALPHA: (2, 120.0, 174.0), BETA: (3, 300.0, 570.0)}
ANSWER_BY_GROUP = {"": (2, 120.0, 174.0), "sre": (2, 360.0, 576.0), "security": (2, 450.0, 585.0)}
OUTCOMES_24H = {
    "answered": 5,
    "expired": 1,
    "expired_share": 0.1667,
    "approvals_decided": 3,
    "denied": 1,
    "denied_share": 0.3333,
    "sent_back": 1,
    "sent_back_share": 0.3333,
}


def _run(agent: str, status: str, *, finished: dt.datetime | None = None, **fields: Any) -> Run:
    run = Run.objects.create(agent=agent, status=status, **fields)
    created = (finished or timezone.now()) - dt.timedelta(minutes=1)
    Run.objects.filter(pk=run.pk).update(created_at=created, finished_at=finished)
    run.refresh_from_db()
    return run


def _attempt(
    run: Run, number: int, status: str, *, ended: dt.datetime | None = None, **error: Any
) -> Attempt:
    return Attempt.objects.create(
        run=run, number=number, status=status, reason="initial", ended_at=ended, **error
    )


def _request(
    run: Run,
    kind: str,
    status: str,
    *,
    asked: dt.datetime,
    answered_after: float | None = None,
    closed: dt.datetime | None = None,
    decision: str = "",
    groups: list[str] | None = None,
) -> InputRequest:
    attempt = run.attempts.order_by("-number").first() or _attempt(run, 1, "interrupted")
    req = InputRequest.objects.create(
        run=run,
        attempt=attempt,
        kind=kind,
        prompt="?",
        accepted_schema={"type": "object"},
        expires_at=asked + dt.timedelta(days=1),
        status=status,
        answer={"decision": decision, "comment": "c"}
        if decision
        else ({"v": 1} if answered_after else None),
        answered_at=asked + dt.timedelta(seconds=answered_after) if answered_after else None,
        closed_at=closed,
        policy={"groups": groups} if groups else {},
    )
    InputRequest.objects.filter(pk=req.pk).update(created_at=asked)
    return req


def seed_history(*, rollup: bool = True) -> dt.datetime:
    """Write the history; with ``rollup``, run the sweep's rollup on it. Returns now."""
    now = timezone.now()
    ago = lambda **kw: now - dt.timedelta(**kw)  # noqa: E731

    # Finished runs. alpha: 3 succeeded (0.5 each), 1 failed; beta: 2 succeeded (1.0 each),
    # 1 denied. Outside the day: an alpha run cancelled 30 hours ago; outside the week, one
    # that succeeded 10 days ago.
    ok = [_run(ALPHA, "succeeded", finished=ago(hours=1), cost=Decimal("0.5")) for _ in range(3)]
    failed = _run(
        ALPHA, "failed", finished=ago(hours=2), cost=Decimal("0.25"), failure_class="deterministic"
    )
    for _ in range(2):
        _run(BETA, "succeeded", finished=ago(hours=3), cost=Decimal("1"))
    denied = _run(BETA, "failed", finished=ago(hours=3), failure_class="denied")
    _run(ALPHA, "cancelled", finished=ago(hours=30), failure_class="cancelled")
    _run(ALPHA, "succeeded", finished=ago(days=10), cost=Decimal("9"))

    # Failed attempts: transient twice with one fingerprint, deterministic once, the denied
    # approval, and a lease lost.
    _attempt(
        failed,
        1,
        "failed",
        ended=ago(hours=2, minutes=10),
        error_class="transient",
        error_type="TimeoutError",
        error_message="upstream <b>slow</b>",
        error_fingerprint="fpA",
    )
    _attempt(
        failed,
        2,
        "failed",
        ended=ago(hours=2),
        error_class="deterministic",
        error_type="ValueError",
        error_message="bad input",
        error_fingerprint="fpB",
    )
    _attempt(
        ok[0],
        1,
        "failed",
        ended=ago(hours=1, minutes=10),
        error_class="transient",
        error_type="TimeoutError",
        error_message="upstream <b>slow</b>",
        error_fingerprint="fpA",
    )
    _attempt(ok[0], 2, "succeeded", ended=ago(hours=1))
    _attempt(
        denied,
        1,
        "failed",
        ended=ago(hours=3),
        error_class="denied",
        error_type="ApprovalDenied",
        error_message="no",
        error_fingerprint="fpD",
    )
    _attempt(
        ok[1],
        1,
        "lost",
        ended=ago(hours=5),
        error_class="lease_lost",
        error_type="LeaseLost",
        error_message="lease ran out",
        error_fingerprint="fpL",
    )

    # Open requests now: two questions of alpha, one approval of beta (the oldest, 2 h).
    for minutes in (50, 10):
        waiting = _run(ALPHA, "input_required")
        _request(waiting, "input_required", "pending", asked=ago(minutes=minutes))
    approval = _run(BETA, "auth_required")
    _request(approval, "auth_required", "pending", asked=ago(hours=2))

    # Answered in the day: alpha's questions after 60 s and 180 s; beta's approvals approved
    # (120 s, sre), denied (600 s, sre and security), sent back (300 s, security).
    answered = _run(ALPHA, "running")
    _request(answered, "input_required", "answered", asked=ago(hours=6), answered_after=60)
    _request(answered, "input_required", "answered", asked=ago(hours=7), answered_after=180)
    decided = _run(BETA, "running")
    for decision, seconds, groups in (
        ("approve", 120, ["sre"]),
        ("deny", 600, ["sre", "security"]),
        ("respond", 300, ["security"]),
    ):
        _request(
            decided,
            "auth_required",
            "answered",
            asked=ago(hours=4),
            answered_after=seconds,
            decision=decision,
            groups=groups,
        )
    # Not counted in the day: answered two days ago; a pause continued (not a hold point).
    _request(answered, "input_required", "answered", asked=ago(days=2), answered_after=30)
    _request(answered, "pause", "answered", asked=ago(hours=1), answered_after=30)
    # Expired in the day.
    _request(answered, "input_required", "expired", asked=ago(hours=9), closed=ago(hours=4))

    # Workers: one alive, one that stopped.
    for name, stopped in (("w-alive", None), ("w-gone", ago(hours=1))):
        Worker.objects.create(
            principal="process",
            name=name,
            kind="process",
            lease_seconds=60,
            identity_hash=name,
            first_seen_at=ago(hours=2),
            since=ago(hours=2),
            last_seen_at=ago(seconds=5),
            stale_at=now + dt.timedelta(minutes=2),
            gone_at=now + dt.timedelta(minutes=6),
            stopped_at=stopped,
        )
    if rollup:
        stats_rollup(force=True)
    return now
