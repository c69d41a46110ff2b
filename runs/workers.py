"""Worker presence: who a worker says it is, and whether it is alive, stale or gone.

A worker tells who it is on every call (docs/protocol.md, identity: name, client and
version, host, pid, concurrency, agents); an in-process pool says the same for itself.
``runs.services.worker_seen`` records it at a bounded rate, this module holds the rules:

- **the limits** of each field (``identity_problem``): every string is bounded, and a
  name is printable text;
- **the windows** (``windows``): a worker contacts the server at least every
  ``max(lease, claim wait)`` seconds (a heartbeat every third of the lease while it runs
  something, a claim every ``wait`` while it is idle), and a contact is written at most
  every ``TOUCH_SECONDS``. So it is alive until ``window`` (that, plus twice
  ``TOUCH_SECONDS``) after its last recorded contact, stale until ``STALE_WINDOWS`` windows after it, gone after that (or at once when
  it said it stopped);
- **which attempts are whose** (``worker_name_of``): a worker's threads claim as
  ``<name>/<n>``, so an attempt's ``worker_id`` names its worker.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings

from runs.models import Worker

# A contact is written at most this often per worker and process (the hot path reads a
# dictionary, not the database, in between).
TOUCH_SECONDS = 5.0
# Stale for this many windows after the last contact, then gone.
STALE_WINDOWS = 3
# A gone worker stays listed this long after its last contact, then the sweep removes it.
KEEP_GONE = dt.timedelta(days=7)

MAX_NAME = 100
MAX_CLIENT = 100
MAX_VERSION = 40
MAX_HOST = 200
MAX_AGENTS = 100
MAX_AGENT = 100
MAX_CONCURRENCY = 10_000
MAX_PID = 2**31 - 1

PROCESS = "process"


def principal_for_token(token_name: str) -> str:
    return f"token:{token_name}"


@dataclass(frozen=True)
class Identity:
    """What a worker says it is (checked by ``identity_problem`` before it is recorded)."""

    name: str
    principal: str
    kind: str = Worker.Kind.REMOTE
    client: str = ""
    client_version: str = ""
    host: str = ""
    pid: int | None = None
    concurrency: int = 1
    agents: tuple[str, ...] = field(default_factory=tuple)
    lease_seconds: float = 0.0
    wait_seconds: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        return self.principal, self.name

    def digest(self) -> str:
        data = asdict(self)
        data["agents"] = sorted(self.agents)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _printable(value: str) -> bool:
    return value.isprintable() and not any(0xD800 <= ord(c) <= 0xDFFF for c in value)


def identity_problem(identity: Identity) -> str | None:
    """Why ``identity`` cannot be recorded, in words; None when it can."""
    texts = (
        ("name", identity.name, MAX_NAME, True),
        ("client", identity.client, MAX_CLIENT, False),
        ("client version", identity.client_version, MAX_VERSION, False),
        ("host", identity.host, MAX_HOST, False),
    )
    for what, value, limit, required in texts:
        if not isinstance(value, str) or len(value) > limit or (required and not value.strip()):
            return f"The worker's {what} must be text of {int(required)} to {limit} characters."
        if not _printable(value):
            return f"The worker's {what} must be printable text."
    if identity.pid is not None and not 0 <= identity.pid <= MAX_PID:
        return f"The worker's pid must be a number from 0 to {MAX_PID}."
    if not 1 <= identity.concurrency <= MAX_CONCURRENCY:
        return f"The worker's concurrency must be from 1 to {MAX_CONCURRENCY}."
    if len(identity.agents) > MAX_AGENTS or not all(
        isinstance(a, str) and 0 < len(a) <= MAX_AGENT and _printable(a) for a in identity.agents
    ):
        return f"The worker's agents must be at most {MAX_AGENTS} names of 1 to {MAX_AGENT} characters."
    return None


def worker_name_of(worker_id: str) -> str:
    """The worker a claim's ``worker_id`` belongs to: ``name/3`` is thread 3 of ``name``."""
    name, slash, number = worker_id.rpartition("/")
    return name[:MAX_NAME] if slash and name and number.isdigit() else worker_id[:MAX_NAME]


def default_lease_seconds() -> float:
    return float(settings.HOLDPOINT_LEASE_SECONDS)


def window(lease_seconds: float, wait_seconds: float) -> float:
    """Seconds after its last recorded contact that a worker is still alive: its longest
    silence, plus twice the most a recorded contact may lag a real one."""
    return max(lease_seconds or default_lease_seconds(), wait_seconds) + 2 * TOUCH_SECONDS


def windows(now: dt.datetime, lease_seconds: float, wait_seconds: float) -> dict[str, Any]:
    """``stale_at`` and ``gone_at`` of a worker last heard from at ``now``."""
    seconds = window(lease_seconds, wait_seconds)
    return {
        "stale_at": now + dt.timedelta(seconds=seconds),
        "gone_at": now + dt.timedelta(seconds=seconds * STALE_WINDOWS),
    }


def state_at(worker: Worker, now: dt.datetime) -> str:
    """Alive, stale or gone at ``now`` (the one rule: the page, the API, waiting runs)."""
    if worker.stopped_at is not None or worker.gone_at <= now:
        return Worker.State.GONE
    if worker.stale_at <= now:
        return Worker.State.STALE
    return Worker.State.ALIVE


def serves(worker: Worker, agent: str) -> bool:
    """Whether ``worker`` claims runs of ``agent`` (no agents named: whatever it may)."""
    return not worker.agents or agent in worker.agents


# --- Reads: the Workers page and GET /api/workers ------------------------------------------

# The page lists at most this many workers (newest contact first), each with at most this
# many of its recent lease losses, from the last ``LOSSES_SINCE``.
MAX_LISTED = 200
MAX_RUNNING = 1_000
MAX_LOSSES = 500
LOSSES_SHOWN = 5
LOSSES_SINCE = dt.timedelta(hours=24)


def principal_of_attempt(token_name: str | None) -> str:
    return principal_for_token(token_name) if token_name else PROCESS


def workers_overview(now: dt.datetime) -> list[dict[str, Any]]:
    """Every worker (newest contact first, at most ``MAX_LISTED``) with its state at
    ``now``, the attempts it runs now and its lease losses of the last ``LOSSES_SINCE``.
    Three queries, whatever the number of workers."""
    from runs.models import Attempt
    from runs.states import AttemptStatus

    workers = list(Worker.objects.order_by("-last_seen_at", "pk")[:MAX_LISTED])
    fields = (
        "id",
        "run_id",
        "run__agent",
        "number",
        "worker_id",
        "worker_token__name",
        "started_at",
        "lease_expires_at",
        "ended_at",
    )
    by_worker: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}

    def add(kind: str, row: dict[str, Any]) -> None:
        key = (principal_of_attempt(row["worker_token__name"]), worker_name_of(row["worker_id"]))
        by_worker.setdefault(key, {"running": [], "losses": []})[kind].append(
            {
                "attempt_id": row["id"],
                "run_id": row["run_id"],
                "agent": row["run__agent"],
                "number": row["number"],
                "started_at": row["started_at"],
                "lease_expires_at": row["lease_expires_at"],
                "ended_at": row["ended_at"],
            }
        )

    if workers:
        running = Attempt.objects.filter(status=AttemptStatus.RUNNING).order_by("started_at")
        for row in running.values(*fields)[:MAX_RUNNING]:
            add("running", row)
        # attempt_lost_idx serves this: status = 'lost' ORDER BY ended_at DESC.
        lost = Attempt.objects.filter(
            status=AttemptStatus.LOST, ended_at__gte=now - LOSSES_SINCE
        ).order_by("-ended_at")
        for row in lost.values(*fields)[:MAX_LOSSES]:
            add("losses", row)
    rows = []
    for worker in workers:
        found = by_worker.get((worker.principal, worker.name), {"running": [], "losses": []})
        rows.append(
            {
                "worker": worker,
                "state": state_at(worker, now),
                "token": worker.principal.removeprefix("token:")
                if worker.principal != PROCESS
                else "",
                "running": found["running"],
                "losses": found["losses"][:LOSSES_SHOWN],
                "loss_count": len(found["losses"]),
            }
        )
    return rows
