"""When a lease has run out, and whether a worker holds a run now: the one rule that the
fence, the sweep, cancel, pause and the ledger use.

A lease is live strictly before its expiry instant; at that instant it has run out. The
fence refuses a write at that instant and the sweep may take the attempt back at that same
instant, so no moment exists in which one judge calls a lease live and another dead.
Times are the database's (``runs/db.py``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Q

from runs.states import LEASED, AttemptStatus


def lease_ran_out(expires_at: dt.datetime | None, now: dt.datetime) -> bool:
    """True when a lease that ends at ``expires_at`` is over at ``now`` (no expiry: no lease)."""
    return expires_at is None or expires_at <= now


def lease_ran_out_q(now: dt.datetime, *, prefix: str = "") -> Q:
    """``lease_ran_out`` in SQL, for attempts (``prefix="attempt__"`` from a related row).

    A running attempt always has an expiry; a NULL one matches nothing here, so callers that
    must treat "no lease" as over say so next to this condition."""
    return Q(**{f"{prefix}lease_expires_at__lte": now})


def worker_holds(run: Any, attempt: Any, now: dt.datetime) -> bool:
    """Whether a worker holds ``run`` at ``now``: the run is in a leased state, ``attempt`` is
    its current attempt, running, and its lease has not run out. Cancel asks it (a worker
    must acknowledge, or the cancel is final at once), pause (stop at the step boundary, or
    at once) and the ledger (is an effect's worker gone)."""
    return (
        attempt is not None
        and run.status in LEASED
        and run.current_attempt_id == attempt.id
        and attempt.status == AttemptStatus.RUNNING
        and not lease_ran_out(attempt.lease_expires_at, now)
    )
