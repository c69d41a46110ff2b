"""Run events and the signals sent once they are committed.

``append_event`` must be called with the run row locked, inside the transaction
that changes the run: the event and the change commit together or not at all.

After commit, listeners registered with ``on_run_changed`` are called with ids
only (the websocket broadcaster, metrics). On PostgreSQL, workers are woken with
``NOTIFY`` sent inside the transaction: PostgreSQL delivers it at commit and
drops it on rollback, so a worker never wakes for work that does not exist.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.db.models.signals import post_save

from runs.models import Run, RunEvent


class EventType(StrEnum):
    """Every event type the run store writes. The side-effect ledger's are its own
    (``ledger/events.py``); the timeline's sentence for each is in ``dashboard/present.py``."""

    RUN_CREATED = "run.created"
    RUN_APPROVED_AT_START = "run.approved_at_start"
    ATTEMPT_CLAIMED = "attempt.claimed"
    CHECKPOINT_SAVED = "checkpoint.saved"
    RUN_INTERRUPTED = "run.interrupted"
    REQUEST_ANSWERED = "request.answered"
    # One person's approval when the request's policy needs more (runs/services/approvals.py).
    APPROVAL_GIVEN = "approval.given"
    # A deny that does not close the request (its policy's any_deny_closes is false).
    APPROVAL_OBJECTED = "approval.objected"
    REQUEST_CLOSED = "request.closed"
    RUN_RESUMED = "run.resumed"
    RUN_CANCEL_REQUESTED = "run.cancel_requested"
    RUN_CANCELLED = "run.cancelled"
    RUN_PAUSE_REQUESTED = "run.pause_requested"
    RUN_PAUSED = "run.paused"
    RUN_CONTINUED = "run.continued"
    RUN_HELD = "run.held"
    AGENT_PAUSED = "agent.paused"
    AGENT_UNPAUSED = "agent.unpaused"
    RUN_RETRIED = "run.retried"
    ATTEMPT_FAILED = "attempt.failed"
    RUN_FAILED = "run.failed"
    RUN_BACKING_OFF = "run.backing_off"
    RUN_QUEUED = "run.queued"
    RUN_REQUEUED = "run.requeued"
    ATTEMPT_LOST = "attempt.lost"
    ATTEMPT_RELEASED = "attempt.released"
    RUN_SUCCEEDED = "run.succeeded"
    AGENT_LOG = "agent.log"


logger = logging.getLogger(__name__)

WORK_CHANNEL = "holdpoint_work"
CANCEL_CHANNEL = "holdpoint_cancel"
PAUSE_CHANNEL = "holdpoint_pause"

RunChangedListener = Callable[[str, str], None]
_listeners: list[RunChangedListener] = []


def append_event(
    run: Run, type: EventType | str, actor: str, payload: dict[str, Any] | None = None
) -> RunEvent:
    """Append the next event of ``run`` (locked by the caller) and schedule the change signal.

    Inside ``batched_events(run)`` the event is kept and written with the others in one
    statement when the service writes the run (``runs.services.write_run``)."""
    run.last_event_seq += 1
    batch: list[RunEvent] | None = getattr(run, _BATCH, None)
    if batch is not None:
        event = RunEvent(
            run=run, seq=run.last_event_seq, type=type, actor=actor, payload=payload or {}
        )
        batch.append(event)
    else:
        event = RunEvent.objects.create(
            run=run, seq=run.last_event_seq, type=type, actor=actor, payload=payload or {}
        )
    _schedule_changed(run.id, type)
    return event


_BATCH = "_holdpoint_event_batch"


@contextmanager
def batched_events(run: Run) -> Iterator[None]:
    """Keep the events ``append_event`` appends to ``run`` until ``take_events`` writes them
    (one INSERT instead of one per event). Events left at the end of the block are inserted
    then; on an exception nothing is (the transaction rolls back anyway)."""
    setattr(run, _BATCH, [])
    try:
        yield
        left = take_events(run)
        if left:
            RunEvent.objects.bulk_create(left)
            events_saved(left)
    finally:
        if hasattr(run, _BATCH):
            delattr(run, _BATCH)


def take_events(run: Run) -> list[RunEvent]:
    """The events kept for ``run`` so far (and keep none from now on in this batch)."""
    batch: list[RunEvent] | None = getattr(run, _BATCH, None)
    if not batch:
        return []
    taken = list(batch)
    batch.clear()
    return taken


def events_saved(events: list[RunEvent]) -> None:
    """Send ``post_save`` for events written in bulk, as ``create`` would have (the live push
    collects its runs from it)."""
    for event in events:
        post_save.send(
            sender=RunEvent, instance=event, created=True, raw=False, using=connection.alias
        )


def on_run_changed(listener: RunChangedListener) -> RunChangedListener:
    """Register ``listener(run_id, event_type)`` to be called after each committed change."""
    if listener not in _listeners:
        _listeners.append(listener)
    return listener


def remove_run_changed(listener: RunChangedListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def _schedule_changed(run_id: str, event_type: str) -> None:
    for listener in list(_listeners):
        # robust=True: a failing push must not break the commit that already happened.
        transaction.on_commit(partial(listener, run_id, event_type), robust=True)


def work_notice(agent: str) -> tuple[str, str]:
    """The NOTIFY that wakes idle workers for ``agent`` (for ``runs.services.write_run``)."""
    return WORK_CHANNEL, agent


def notify_work(agent: str) -> None:
    """Wake idle workers: an attempt of ``agent`` is due (delivered at commit)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", work_notice(agent))


def cancel_notice(attempt_id: str) -> tuple[str, str]:
    """The NOTIFY that tells the worker holding ``attempt_id`` to stop at its next safe point
    (for ``runs.services.write_run``, which sends it with the run's write)."""
    return CANCEL_CHANNEL, attempt_id


def notify_cancel(attempt_id: str) -> None:
    """Tell the worker holding ``attempt_id`` to stop at its next safe point (at commit)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", cancel_notice(attempt_id))


def notify_pause(attempt_id: str) -> None:
    """Tell the worker holding ``attempt_id`` to stop at its next step boundary (at commit)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [PAUSE_CHANNEL, attempt_id])
