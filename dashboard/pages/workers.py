"""The Workers page: every worker, in process and remote, whether it is alive, what it
runs now and the leases it lost lately (the page and its live socket share it)."""

from __future__ import annotations

import hashlib
from typing import Any

from dashboard.present import absolute, clock
from runs.db import db_now
from runs.workers import workers_overview

STATE_TONE = {"alive": "good", "stale": "warn", "gone": "neutral"}


def workers_context() -> dict[str, Any]:
    """The page's rows (the same read as ``GET /api/workers``) and a token naming them."""
    rows = []
    for row in workers_overview(db_now()):
        worker = row["worker"]
        rows.append(
            {
                **row,
                "tone": STATE_TONE.get(row["state"], "neutral"),
                "last_seen": clock(worker.last_seen_at),
                "last_seen_title": absolute(worker.last_seen_at),
                "since": clock(worker.since),
            }
        )
    shown = "|".join(
        f"{r['worker'].pk}:{r['state']}:{r['worker'].identity_hash}:{r['last_seen']}:"
        f"{','.join(a['attempt_id'] for a in r['running'])}:{r['loss_count']}"
        for r in rows
    )
    return {
        "workers": rows,
        "alive": sum(1 for r in rows if r["state"] == "alive"),
        "live_token": hashlib.sha256(shown.encode()).hexdigest()[:16],
    }
