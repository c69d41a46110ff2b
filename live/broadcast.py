"""Pushes to the live dashboard: one channel-layer message per committed transaction.

Every change of a run appends a ``RunEvent`` inside the transaction that makes it
(``runs.events.append_event``; the ledger's side-effect events too). A receiver of
that row's ``post_save`` notes the run in a set that belongs to the transaction and,
the first time, schedules one ``transaction.on_commit(..., robust=True)`` that sends
the whole set. So one service call that appends five events sends one message, a
rolled-back transaction (or savepoint) sends nothing, and a push that fails never
breaks a commit that already happened.

``runs.events.on_run_changed`` cannot do this: its listeners run after the commit,
once per event, when the transaction's set can no longer be collected.

Messages carry ids only and survive a JSON round trip::

    {"type": "runs.changed", "run_ids": ["run_…", …], "request_run_ids": [...], "push_id": "…"}

``request_run_ids`` are the runs whose questions changed (asked, answered, closed,
expired: an ``InputRequest`` was saved, or an event about one was appended), so the
inbox and its badge, which show only questions, can skip pushes about anything else.
Each web process has one channel in the group ``GROUP`` (``live.consumers``); its
sockets re-read what their pages show and render the same named partials as the pages,
so a duplicated, late or reordered message does no harm.

Delivery never blocks the committing thread. With Redis (``REDIS_URL``, every
deployment where workers run in other processes) messages go out from one event
loop thread per process that keeps its connection. The in-memory layer reaches only
consumers in this process and its queues belong to their event loop, so messages
are handed to that loop (``attach_loop``); with no consumer here, there is no one
to tell.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import threading
import uuid
import weakref
from collections.abc import Coroutine, Iterable
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models.signals import post_save

from runs.events import EventType
from runs.models import InputRequest, RunEvent

logger = logging.getLogger(__name__)

GROUP = "holdpoint.runs"
MESSAGE_TYPE = "runs.changed"


# --- Collecting the runs a transaction changed ---------------------------------------------


# Run events that are about a run's question (the inbox shows questions only).
REQUEST_EVENTS = frozenset(
    {EventType.RUN_INTERRUPTED, EventType.REQUEST_ANSWERED, EventType.REQUEST_CLOSED}
)


class Batch:
    """The runs one transaction changed; called once, when it commits."""

    def __init__(self) -> None:
        self.run_ids: set[str] = set()
        self.request_run_ids: set[str] = set()
        self.sent = False

    def __call__(self) -> None:
        self.sent = True
        push(sorted(self.run_ids), request_run_ids=sorted(self.request_run_ids))

    def __repr__(self) -> str:
        return f"<push of {sorted(self.run_ids)}>"


# One open batch per database connection (connections are per thread).
_batches: weakref.WeakKeyDictionary[Any, Batch] = weakref.WeakKeyDictionary()


def run_changed(run_id: str, *, requests: bool = False, using: str = DEFAULT_DB_ALIAS) -> None:
    """Note that ``run_id`` changed in the current transaction (``requests``: one of its
    questions did); push once it commits."""
    connection = transaction.get_connection(using)
    batch = _batches.get(connection)
    # A batch whose callback is no longer waiting for the commit was sent (or captured
    # by a test), or its transaction or savepoint was rolled back and Django dropped the
    # callback with everything else: start a new one.
    if batch is None or batch.sent or not _waiting(connection, batch):
        batch = Batch()
        _batches[connection] = batch
        batch.run_ids.add(run_id)
        if requests:
            batch.request_run_ids.add(run_id)
        transaction.on_commit(batch, using=using, robust=True)
        return
    batch.run_ids.add(run_id)
    if requests:
        batch.request_run_ids.add(run_id)


def _waiting(connection: Any, batch: Batch) -> bool:
    return any(callback is batch for _sids, callback, _robust in connection.run_on_commit)


def _on_run_event_saved(
    sender: type[RunEvent], instance: RunEvent, created: bool, raw: bool = False, **kwargs: Any
) -> None:
    if created and not raw:
        run_changed(
            instance.run_id,
            requests=instance.type in REQUEST_EVENTS,
            using=kwargs.get("using") or DEFAULT_DB_ALIAS,
        )


def _on_request_saved(
    sender: type[InputRequest], instance: InputRequest, raw: bool = False, **kwargs: Any
) -> None:
    if not raw:
        run_changed(instance.run_id, requests=True, using=kwargs.get("using") or DEFAULT_DB_ALIAS)


def connect_signals() -> None:
    """Called from ``RunsConfig.ready``: every appended run event, and every saved
    question, marks its run changed."""
    post_save.connect(_on_run_event_saved, sender=RunEvent, dispatch_uid="holdpoint-push")
    post_save.connect(_on_request_saved, sender=InputRequest, dispatch_uid="holdpoint-push-q")


# --- Sending -----------------------------------------------------------------------------


def message_for(run_ids: Iterable[str], request_run_ids: Iterable[str] = ()) -> dict[str, Any]:
    return {
        "type": MESSAGE_TYPE,
        "run_ids": list(run_ids),
        "request_run_ids": list(request_run_ids),
        "push_id": uuid.uuid4().hex,
    }


def push(
    run_ids: list[str], *, request_run_ids: list[str] | None = None
) -> concurrent.futures.Future[None] | None:
    """Tell every live page that ``run_ids`` changed (after the commit, never blocking).

    Returns the future of the send, or None when nothing was sent (no channel layer,
    or the in-memory layer with no consumer in this process).
    """
    if not run_ids:
        return None
    layer = get_channel_layer()
    if layer is None:
        return None
    message = message_for(run_ids, request_run_ids or ())
    if isinstance(layer, InMemoryChannelLayer):
        loop = _consumer_loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return None
        return _sender.submit(layer.group_send(GROUP, message), loop)
    return _sender.submit(layer.group_send(GROUP, message), _sender.loop())


_consumer_loop: asyncio.AbstractEventLoop | None = None


def attach_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The event loop the consumers of this process run on (the in-memory layer's home)."""
    global _consumer_loop
    _consumer_loop = loop


class _Sender:
    """An event loop on a daemon thread that sends pushes for the whole process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._pending: set[concurrent.futures.Future[None]] = set()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            # A forked child inherits the parent's loop object but not its thread.
            alive = self._thread is not None and self._thread.is_alive()
            if self._loop is None or self._pid != os.getpid() or not alive:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name="holdpoint-push", daemon=True
                )
                self._thread.start()
                self._pid = os.getpid()
            return self._loop

    def submit(
        self, coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop
    ) -> concurrent.futures.Future[None]:
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)
        if not future.cancelled() and future.exception() is not None:
            # A lost push costs a page one update; its next push or reconnect catches up.
            logger.warning("live push failed: %r", future.exception())

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the pushes still on their way."""
        with self._lock:
            pending = list(self._pending)
        if not pending:
            return True
        _done, not_done = concurrent.futures.wait(pending, timeout=timeout)
        return not not_done


_sender = _Sender()


def drain(timeout: float = 2.0) -> bool:
    """Wait for the pushes still on their way (short-lived commands, tests, benchmarks)."""
    return _sender.drain(timeout)


# A command that changes a run and exits at once (answerrun) still tells the browsers.
atexit.register(drain, 2.0)
