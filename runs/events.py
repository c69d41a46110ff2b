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
from collections.abc import Callable
from functools import partial
from typing import Any

from django.db import connection, transaction

from runs.models import Run, RunEvent

logger = logging.getLogger(__name__)

WORK_CHANNEL = "holdpoint_work"
CANCEL_CHANNEL = "holdpoint_cancel"
PAUSE_CHANNEL = "holdpoint_pause"

RunChangedListener = Callable[[str, str], None]
_listeners: list[RunChangedListener] = []


def append_event(
    run: Run, type: str, actor: str, payload: dict[str, Any] | None = None
) -> RunEvent:
    """Append the next event of ``run`` (locked by the caller) and schedule the change signal."""
    run.last_event_seq += 1
    event = RunEvent.objects.create(
        run=run, seq=run.last_event_seq, type=type, actor=actor, payload=payload or {}
    )
    _schedule_changed(run.id, type)
    return event


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


def notify_work(agent: str) -> None:
    """Wake idle workers: an attempt of ``agent`` is due (delivered at commit)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [WORK_CHANNEL, agent])


def notify_cancel(attempt_id: str) -> None:
    """Tell the worker holding ``attempt_id`` to stop at its next safe point (at commit)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CANCEL_CHANNEL, attempt_id])


def notify_pause(attempt_id: str) -> None:
    """Tell the worker holding ``attempt_id`` to stop at its next step boundary (at commit)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [PAUSE_CHANNEL, attempt_id])
