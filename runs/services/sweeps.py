"""Sweeps: the time-driven transitions. Any number of workers run them at once.

Each sweep lists candidates without locks, then handles each run in its own short
transaction under ``SELECT … FOR UPDATE SKIP LOCKED``: a run another sweeper (or a
control operation) holds is skipped this round rather than waited for, so there
is no single scheduler to lose and no two sweepers act on one run.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext_noop

from runs.db import db_now
from runs.events import EventType, append_event, notify_work
from runs.leases import lease_ran_out, lease_ran_out_q
from runs.metrics import LEASE_EXPIRIES
from runs.models import Attempt, Checkpoint, InputRequest, Run, RunEvent
from runs.services._base import close_request
from runs.services.failures import expire_request_locked, fail_locked_for_lost_lease
from runs.states import ANSWERABLE, TERMINAL, AttemptStatus, RequestStatus, RunStatus, next_status


def _try_lock(run_id: str) -> Run | None:
    return Run.objects.select_for_update(skip_locked=True, of=("self",)).filter(pk=run_id).first()


@dataclass
class SweepReport:
    leases_expired: int = 0
    requests_expired: int = 0
    backoffs_due: int = 0
    other: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return (
            self.leases_expired
            + self.requests_expired
            + self.backoffs_due
            + sum(self.other.values())
        )


def leases_expire(*, limit: int = 100) -> int:
    """Mark attempts whose lease ran out ``lost`` and continue or stop their runs."""
    now = db_now()
    # attempt_lease_expiry_idx serves this: status = 'running' AND lease_expires_at <= now.
    run_ids = list(
        Attempt.objects.filter(lease_ran_out_q(now), status=AttemptStatus.RUNNING)
        .order_by("lease_expires_at")
        .values_list("run_id", flat=True)[:limit]
    )
    done = 0
    for run_id in run_ids:
        with transaction.atomic(durable=True):
            run = _try_lock(run_id)
            if run is None or run.current_attempt_id is None:
                continue
            attempt = Attempt.objects.get(pk=run.current_attempt_id)
            now = db_now()
            # Re-check under the lock: the worker may have renewed or finished meanwhile.
            if attempt.status != AttemptStatus.RUNNING or not lease_ran_out(
                attempt.lease_expires_at, now
            ):
                continue
            fail_locked_for_lost_lease(run, attempt, now=now)
            run.save()
            LEASE_EXPIRIES.inc()
            done += 1
    return done


def requests_expire(*, limit: int = 100) -> int:
    """Fail runs whose question was not answered in time (the person's clock)."""
    now = timezone.now()
    # request_pending_expiry_idx serves this: status = 'pending' AND expires_at <= now.
    rows = list(
        InputRequest.objects.filter(status=RequestStatus.PENDING, expires_at__lte=now)
        .order_by("expires_at")
        .values_list("id", "run_id")[:limit]
    )
    done = 0
    for request_id, run_id in rows:
        with transaction.atomic(durable=True):
            run = _try_lock(run_id)
            if run is None:
                continue
            request = InputRequest.objects.get(pk=request_id)
            if request.status != RequestStatus.PENDING or request.expires_at > timezone.now():
                continue
            if run.pending_request_id != request.id or run.status not in ANSWERABLE:
                # Not the run's open question any more; close it so it leaves the inbox.
                close_request(
                    run,
                    request.id,
                    status=RequestStatus.CANCELLED,
                    reason=gettext_noop("Closed: the run moved on"),
                    now=timezone.now(),
                    actor="system:sweeper",
                )
                run.save(update_fields=["last_event_seq", "updated_at"])
                continue
            expire_request_locked(run, request, now=timezone.now())
            run.save()
            done += 1
    return done


def backoffs_due(*, limit: int = 100) -> int:
    """Move runs whose backoff has passed from ``waiting`` to ``queued``.

    Claims take due ``waiting`` runs directly, so this only makes the status honest
    for the dashboard when no worker is idle.
    """
    now = db_now()
    run_ids = list(
        Run.objects.filter(status=RunStatus.WAITING, not_before__lte=now)
        .order_by("not_before")
        .values_list("id", flat=True)[:limit]
    )
    done = 0
    for run_id in run_ids:
        with transaction.atomic(durable=True):
            run = _try_lock(run_id)
            if run is None or run.status != RunStatus.WAITING:
                continue
            run.status = next_status(run.status, "backoff_due")
            append_event(
                run, EventType.RUN_QUEUED, "system:sweeper", {"attempt_id": run.current_attempt_id}
            )
            notify_work(run.agent)
            run.save()
            done += 1
    return done


def history_purge(*, limit: int = 100) -> int:
    """Delete events and checkpoints of runs that finished more than the retention ago.

    Only terminal runs qualify, and the status is re-checked under the run lock, so a
    run that was retried meanwhile keeps everything. The run row, its attempts, its
    requests and its side effects stay: the summary and the report outlive the detail.
    A retry of a purged run starts from the beginning (it has no checkpoint left).
    """
    days = settings.HOLDPOINT_HISTORY_RETENTION_DAYS
    if not days:
        return 0
    cutoff = timezone.now() - dt.timedelta(days=days)
    # run_finished_unpurged_idx serves this query.
    run_ids = list(
        Run.objects.filter(
            status__in=TERMINAL, history_purged_at__isnull=True, finished_at__lt=cutoff
        )
        .order_by("finished_at")
        .values_list("id", flat=True)[:limit]
    )
    done = 0
    for run_id in run_ids:
        with transaction.atomic(durable=True):
            run = _try_lock(run_id)
            if run is None or run.status not in TERMINAL or run.history_purged_at is not None:
                continue
            run.latest_checkpoint = None
            run.history_purged_at = timezone.now()
            run.save(update_fields=["latest_checkpoint", "history_purged_at", "updated_at"])
            RunEvent.objects.filter(run=run).delete()
            Checkpoint.objects.filter(run=run).delete()
            done += 1
    return done


_extra_sweeps: dict[str, object] = {}


def register_sweep(name: str, func: object) -> None:
    """Other apps add their sweeps (idempotency records, the ledger) to ``sweep_all``."""
    _extra_sweeps[name] = func


def sweep_all(*, limit: int = 100) -> SweepReport:
    report = SweepReport(
        leases_expired=leases_expire(limit=limit),
        requests_expired=requests_expire(limit=limit),
        backoffs_due=backoffs_due(limit=limit),
    )
    for name, func in _extra_sweeps.items():
        report.other[name] = int(func(limit=limit))  # type: ignore[operator]
    return report
