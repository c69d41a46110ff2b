"""Worker presence: record a worker's contact, its stop, and its state as time passes.

None of these changes a run, so none appends a run event; each publishes its change of
presence after its commit (``runs.events.note_worker_changed``) for the Workers page and
for the pages of runs that wait for a worker.

The hot path (every claim, heartbeat and watch of every worker) must not write every
time: ``worker_seen`` remembers, per process, when it last wrote each worker and what it
said, and writes again only after ``TOUCH_SECONDS`` or when something it says changed. A
routine write is one ``UPDATE`` matched on the identity's digest; only a new worker, one
that changed (a restart: another pid) or one coming back from stale or gone takes the
slow path, which is the one that is pushed.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, transaction

from runs.db import db_now
from runs.events import note_worker_changed
from runs.models import Worker
from runs.workers import KEEP_GONE, Identity, identity_problem, windows

logger = logging.getLogger(__name__)

_touched: dict[tuple[str, str], tuple[float, str]] = {}
_touched_lock = threading.Lock()
# The per-process memory is bounded: a flood of names forgets the oldest.
MAX_REMEMBERED = 10_000


def _due(identity: Identity, digest: str, touch_seconds: float) -> bool:
    now = time.monotonic()
    with _touched_lock:
        last = _touched.get(identity.key)
        if last is not None and last[1] == digest and now - last[0] < touch_seconds:
            return False
        if len(_touched) >= MAX_REMEMBERED:
            _touched.pop(next(iter(_touched)))
        _touched[identity.key] = (now, digest)
        return True


# Bumped by forget_contacts: a cache of contacts above this one (api/worker_identity.py)
# forgets with it.
forgotten = 0


def forget_contacts() -> None:
    """Forget when each worker was last written (tests: a rolled-back database forgets the
    rows, so must this process)."""
    global forgotten
    with _touched_lock:
        _touched.clear()
        forgotten += 1


def _forget(identity: Identity) -> None:
    with _touched_lock:
        _touched.pop(identity.key, None)


def worker_seen(*, identity: Identity) -> bool:
    """Record that the worker ``identity`` names was in contact now. Return whether the
    database was written (at most once per ``TOUCH_SECONDS`` per worker and process,
    unless what it says changed).

    Never fails the caller's call: presence is a report, and a worker's heartbeat must not
    be refused because its report could not be written (it is logged, and tried again at
    the next contact)."""
    from runs.workers import TOUCH_SECONDS

    problem = identity_problem(identity)
    if problem is not None:
        raise ValueError(problem)
    digest = identity.digest()
    if not _due(identity, digest, TOUCH_SECONDS):
        return False
    try:
        _record(identity, digest)
    except DatabaseError:
        _forget(identity)
        logger.warning("recording worker %s failed", identity.name, exc_info=True)
        return False
    return True


def _record(identity: Identity, digest: str) -> None:
    with transaction.atomic():
        now = db_now()
        times = windows(now, identity.lease_seconds, identity.wait_seconds)
        # The routine contact: the same worker, alive, saying the same: one UPDATE, no push.
        if Worker.objects.filter(
            principal=identity.principal,
            name=identity.name,
            identity_hash=digest,
            state=Worker.State.ALIVE,
            stopped_at__isnull=True,
        ).update(last_seen_at=now, **times):
            return
        # New, changed, or back: create the row if it is not there (two processes seeing
        # a new worker at once: ON CONFLICT DO NOTHING lets both through), then lock it,
        # so that each writes what it saw in turn and neither fails.
        Worker.objects.bulk_create(
            [
                Worker(
                    principal=identity.principal,
                    name=identity.name,
                    kind=identity.kind,
                    lease_seconds=identity.lease_seconds,
                    identity_hash="",
                    first_seen_at=now,
                    since=now,
                    last_seen_at=now,
                    **times,
                )
            ],
            ignore_conflicts=True,
        )
        row = Worker.objects.select_for_update().get(
            principal=identity.principal, name=identity.name
        )
        if row.identity_hash != digest or row.stopped_at is not None or row.state == "gone":
            row.since = now
        row.kind = identity.kind
        row.client = identity.client
        row.client_version = identity.client_version
        row.host = identity.host
        row.pid = identity.pid
        row.agents = sorted(identity.agents)
        row.concurrency = identity.concurrency
        row.lease_seconds = identity.lease_seconds
        row.wait_seconds = identity.wait_seconds
        row.identity_hash = digest
        row.last_seen_at = now
        row.stale_at, row.gone_at = times["stale_at"], times["gone_at"]
        row.stopped_at = None
        row.state = Worker.State.ALIVE
        row.save()
        note_worker_changed(row.pk)


def worker_stopped(*, principal: str, name: str) -> bool:
    """The worker says it stopped (an in-process pool at its end): gone at once."""
    with _touched_lock:
        _touched.pop((principal, name), None)
    with transaction.atomic():
        row = (
            Worker.objects.select_for_update()
            .filter(principal=principal, name=name, stopped_at__isnull=True)
            .first()
        )
        if row is None:
            return False
        row.stopped_at = db_now()
        row.state = Worker.State.GONE
        row.save(update_fields=["stopped_at", "state"])
        note_worker_changed(row.pk)
    return True


def workers_sweep(*, limit: int = 100) -> int:
    """Move workers that stopped calling to stale, then gone, and publish each move; remove
    the gone ones not heard from for ``KEEP_GONE``. Any number of sweepers may run it: each
    move is a compare-and-set on the state it read."""
    now = db_now()
    moved = 0
    with transaction.atomic():
        # worker_present_idx serves both: state <> 'gone' AND stale_at <= now.
        present = Worker.objects.exclude(state=Worker.State.GONE).filter(stale_at__lte=now)
        for pk, state, gone_at in present.values_list("pk", "state", "gone_at")[:limit]:
            new = Worker.State.GONE if gone_at <= now else Worker.State.STALE
            # The compare-and-set re-checks the time too: a contact that committed since
            # this read renewed stale_at, and the move must not undo it.
            still = Worker.objects.filter(pk=pk, state=state, stale_at__lte=now)
            if new == Worker.State.GONE:
                still = still.filter(gone_at__lte=now)
            if new != state and still.update(state=new):
                note_worker_changed(pk)
                moved += 1
        old = Worker.objects.filter(state=Worker.State.GONE, last_seen_at__lt=now - KEEP_GONE)
        ids = list(old.values_list("pk", flat=True)[:limit])
        if ids:
            Worker.objects.filter(pk__in=ids).delete()
            for pk in ids:
                note_worker_changed(pk)
    return moved
