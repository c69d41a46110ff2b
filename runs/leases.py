"""When a lease has run out: the one rule that the fence, the sweep, cancel and the ledger use.

A lease is live strictly before its expiry instant; at that instant it has run out. The
fence refuses a write at that instant and the sweep may take the attempt back at that same
instant, so no moment exists in which one judge calls a lease live and another dead.
Times are the database's (``runs/clock.py``).
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Q


def lease_ran_out(expires_at: dt.datetime | None, now: dt.datetime) -> bool:
    """True when a lease that ends at ``expires_at`` is over at ``now`` (no expiry: no lease)."""
    return expires_at is None or expires_at <= now


def lease_ran_out_q(now: dt.datetime, *, prefix: str = "") -> Q:
    """``lease_ran_out`` in SQL, for attempts (``prefix="attempt__"`` from a related row).

    A running attempt always has an expiry; a NULL one matches nothing here, so callers that
    must treat "no lease" as over say so next to this condition."""
    return Q(**{f"{prefix}lease_expires_at__lte": now})
