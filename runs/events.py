"""Run events, and the one path that publishes them once they are committed.

``append_event`` must be called with the run row locked, inside the transaction
that changes the run: the event and the change commit together or not at all.

**Publishing** is explicit and happens once per transaction, after its commit, the way
Zulip's ``send_event_on_commit`` does: ``append_event`` notes the event in the
transaction's ``Changes``, whose one ``transaction.on_commit(..., robust=True)`` hands
them to every publisher (``on_commit_publish``): the live dashboard's broadcast
(``live/broadcast.py``: one channel-layer message per transaction) and the in-process
listeners of ``on_run_changed`` (idle workers, waiting claims: called per event). A
rolled-back transaction publishes nothing; a publisher that fails never breaks the
commit that already happened, nor the other publishers. No model signal is involved.

On PostgreSQL, workers in other processes are woken with ``NOTIFY`` sent inside the
transaction: PostgreSQL delivers it at commit and drops it on rollback, so a worker never
wakes for work that does not exist.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from django.db import connection, transaction

from runs.audit import AGENT_AUDIT_EVENT_TYPES, IDENTITY_MAX_LENGTH, VIAS
from runs.db import postgresql
from runs.models import AgentEvent, Run, RunEvent


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
    # A person decided again in the same round: the new decision supersedes theirs.
    APPROVAL_CHANGED = "approval.changed"
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


# Events after which an attempt may be due: idle workers of a process (runtime/worker.py)
# and waiting long-polling claims (runs/wakeups.py) wake on these, in-process, before any
# NOTIFY could reach them.
WORK_EVENTS = frozenset(
    {
        EventType.RUN_CREATED,
        EventType.RUN_RESUMED,
        EventType.RUN_CONTINUED,
        EventType.RUN_HELD,
        EventType.AGENT_UNPAUSED,
        EventType.RUN_RETRIED,
        EventType.RUN_QUEUED,
        EventType.RUN_REQUEUED,
        EventType.ATTEMPT_RELEASED,
    }
)


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
    _note(run.id, str(type))
    return event


def append_agent_event(
    *, agent: str, type: str, actor: str, payload: dict[str, Any] | None = None
) -> AgentEvent:
    """Append an event about ``agent`` as a whole (no run's: its tool rules changed), in the
    caller's transaction, so the change and its audit row commit together or not at all.
    ``type`` is one of ``runs.audit.AGENT_AUDIT_EVENT_TYPES``."""
    if type not in AGENT_AUDIT_EVENT_TYPES:
        raise ValueError(f"unknown agent event {type!r}")
    return AgentEvent.objects.create(agent=agent, type=type, actor=actor, payload=payload or {})


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


# --- Publishing after commit -------------------------------------------------------------------

# Events about a run's questions (asked, decided, answered, closed; a pause is one too): the
# inbox and its badge, which show only questions, skip pushes about anything else.
REQUEST_EVENTS = frozenset(
    {
        EventType.RUN_INTERRUPTED,
        EventType.REQUEST_ANSWERED,
        EventType.REQUEST_CLOSED,
        EventType.APPROVAL_GIVEN,
        EventType.APPROVAL_OBJECTED,
        EventType.APPROVAL_CHANGED,
        EventType.RUN_PAUSED,
        EventType.RUN_CONTINUED,
    }
)


@dataclass(eq=False)
class Changes:
    """What one transaction changed: its events ``(run_id, type)`` in the order appended.
    Called once, when the transaction commits: it hands itself to every publisher."""

    events: list[tuple[str, str]] = field(default_factory=list)
    # Workers whose presence changed (``runs.services.worker_seen`` and the sweep: one
    # appeared, came back, changed, went stale or gone), by ``Worker`` id; and agents
    # whose gate opened or closed. Neither is a run event: a queued run's reason to wait
    # (``runs.selectors.waiting_for_runs``) and the Workers page change with them.
    worker_ids: set[str] = field(default_factory=set)
    agents: set[str] = field(default_factory=set)
    sent: bool = False

    @property
    def run_ids(self) -> set[str]:
        return {run_id for run_id, _type in self.events}

    @property
    def request_run_ids(self) -> set[str]:
        return {run_id for run_id, kind in self.events if kind in REQUEST_EVENTS}

    def __call__(self) -> None:
        self.sent = True
        for publisher in list(_publishers):
            try:
                publisher(self)
            except Exception:
                logger.exception("publishing the changes of %s failed", sorted(self.run_ids))

    def __repr__(self) -> str:
        return f"<changes of {sorted(self.run_ids)}, workers {sorted(self.worker_ids)}>"


Publisher = Callable[[Changes], None]
_publishers: list[Publisher] = []
# The open ``Changes`` of each database connection (connections are per thread).
_open: weakref.WeakKeyDictionary[Any, Changes] = weakref.WeakKeyDictionary()


def on_commit_publish(publisher: Publisher) -> Publisher:
    """Register ``publisher(changes)``: called once per committed transaction that appended
    events, after the commit."""
    if publisher not in _publishers:
        _publishers.append(publisher)
    return publisher


def _note(run_id: str, event_type: str) -> None:
    _open_changes(lambda changes: changes.events.append((run_id, event_type)))


def note_worker_changed(worker_id: Any) -> None:
    """Publish, after the commit, that a worker's presence changed (``runs.models.Worker``)."""
    _open_changes(lambda changes: changes.worker_ids.add(str(worker_id)))


def note_agent_gate_changed(agent: str) -> None:
    """Publish, after the commit, that ``agent``'s gate opened or closed."""
    _open_changes(lambda changes: changes.agents.add(agent))


def _open_changes(add: Callable[[Changes], None]) -> None:
    conn = transaction.get_connection()
    changes = _open.get(conn)
    # A ``Changes`` whose callback is no longer waiting for the commit was sent (or captured
    # by a test), or its transaction or savepoint rolled back and Django dropped the callback
    # with everything else: start a new one. (Outside a transaction, on_commit calls it at
    # once: it is sent before this returns.)
    if changes is None or changes.sent or not _waiting(conn, changes):
        changes = Changes()
        _open[conn] = changes
        add(changes)
        # robust: a failing publisher must not break the commit that already happened.
        transaction.on_commit(changes, robust=True)
        return
    add(changes)


def _waiting(conn: Any, changes: Changes) -> bool:
    return any(callback is changes for _sids, callback, _robust in conn.run_on_commit)


def on_run_changed(listener: RunChangedListener) -> RunChangedListener:
    """Register ``listener(run_id, event_type)`` to be called after each committed change,
    once per event, in order (an in-process publisher: idle workers, waiting claims)."""
    if listener not in _listeners:
        _listeners.append(listener)
    return listener


def remove_run_changed(listener: RunChangedListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


@on_commit_publish
def _tell_listeners(changes: Changes) -> None:
    for run_id, event_type in changes.events:
        for listener in list(_listeners):
            try:
                listener(run_id, event_type)
            except Exception:
                logger.exception("run-changed listener %r failed", listener)


def work_notice(agent: str) -> tuple[str, str]:
    """The NOTIFY that wakes idle workers for ``agent`` (for ``runs.services.write_run``)."""
    return WORK_CHANNEL, agent


def notify_work(agent: str) -> None:
    """Wake idle workers: an attempt of ``agent`` is due (delivered at commit)."""
    if postgresql():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", work_notice(agent))


def cancel_notice(attempt_id: str) -> tuple[str, str]:
    """The NOTIFY that tells the worker holding ``attempt_id`` to stop at its next safe point
    (for ``runs.services.write_run``, which sends it with the run's write)."""
    return CANCEL_CHANNEL, attempt_id


def notify_cancel(attempt_id: str) -> None:
    """Tell the worker holding ``attempt_id`` to stop at its next safe point (at commit)."""
    if postgresql():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", cancel_notice(attempt_id))


def notify_pause(attempt_id: str) -> None:
    """Tell the worker holding ``attempt_id`` to stop at its next step boundary (at commit)."""
    if postgresql():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [PAUSE_CHANNEL, attempt_id])


def how(*, via: str = "", identity: str = "") -> dict[str, str]:
    """The payload members that say how a decision was made: ``via`` and ``identity``,
    each only when given. An unknown ``via`` is a programming error (``ValueError``);
    an identity longer than 200 characters is cut there (an identity provider's subject
    can be long, and a decision must not fail for it)."""
    if via and via not in VIAS:
        raise ValueError(f"unknown door {via!r}; one of {sorted(VIAS)}")
    if not isinstance(identity, str):
        raise ValueError("identity must be text")
    members: dict[str, str] = {}
    if via:
        members["via"] = via
    if identity:
        members["identity"] = identity[:IDENTITY_MAX_LENGTH]
    return members
