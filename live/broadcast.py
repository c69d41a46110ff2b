"""Pushes to the live dashboard: one channel-layer message per committed transaction.

Every change of a run appends a ``RunEvent`` inside the transaction that makes it
(``runs.events.append_event``; the ledger's side-effect events too), and the run store
publishes each committed transaction's events once (``runs.events.on_commit_publish``):
this module's publisher sends them as one message. So one service call that appends five
events sends one message, a rolled-back transaction sends nothing, and a push that fails
never breaks a commit that already happened.

Messages carry ids only and survive a JSON round trip::

    {"type": "runs.changed", "run_ids": ["run_…", …], "request_run_ids": [...],
     "worker_ids": ["12", …], "agents": ["deploy", …], "push_id": "…"}

``request_run_ids`` are the runs whose questions changed (asked, answered, closed,
expired: an event about one was appended, ``runs.events.REQUEST_EVENTS``), so the
inbox and its badge, which show only questions, can skip pushes about anything else.
``worker_ids`` are workers whose presence changed and ``agents`` agents whose gate
opened or closed (``runs.events.Changes``): the Workers page, and the pages of runs that
wait for a worker or their agent, re-read them.
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
from collections.abc import Coroutine, Iterable
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer

from runs.events import Changes, on_commit_publish

logger = logging.getLogger(__name__)

GROUP = "holdpoint.runs"
MESSAGE_TYPE = "runs.changed"


# --- What a transaction changed ---------------------------------------------------------------


def _publish(changes: Changes) -> None:
    """The run store's after-commit publisher for the live pages: one message per committed
    transaction (``runs.events.Changes``), however many events it appended."""
    push(
        sorted(changes.run_ids),
        request_run_ids=sorted(changes.request_run_ids),
        worker_ids=sorted(changes.worker_ids),
        agents=sorted(changes.agents),
    )


def connect_signals() -> None:
    """Called from ``LiveConfig.ready``: every committed transaction that appended run
    events (the ledger's side-effect events too) is pushed once."""
    on_commit_publish(_publish)


# --- Sending -----------------------------------------------------------------------------


def message_for(
    run_ids: Iterable[str],
    request_run_ids: Iterable[str] = (),
    worker_ids: Iterable[str] = (),
    agents: Iterable[str] = (),
) -> dict[str, Any]:
    return {
        "type": MESSAGE_TYPE,
        "run_ids": list(run_ids),
        "request_run_ids": list(request_run_ids),
        "worker_ids": list(worker_ids),
        "agents": list(agents),
        "push_id": uuid.uuid4().hex,
    }


def push(
    run_ids: list[str],
    *,
    request_run_ids: list[str] | None = None,
    worker_ids: list[str] | None = None,
    agents: list[str] | None = None,
) -> concurrent.futures.Future[None] | None:
    """Tell every live page that ``run_ids`` changed, or the presence of ``worker_ids``, or
    the gate of ``agents`` (after the commit, never blocking).

    Returns the future of the send, or None when nothing was sent (no channel layer,
    or the in-memory layer with no consumer in this process).
    """
    if not run_ids and not worker_ids and not agents:
        return None
    layer = get_channel_layer()
    if layer is None:
        return None
    message = message_for(run_ids, request_run_ids or (), worker_ids or (), agents or ())
    if isinstance(layer, InMemoryChannelLayer):
        loop = _consumer_loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return None
        return _sender.submit(layer.group_send(GROUP, message), loop)
    return _sender.send(layer.group_send(GROUP, message))


_consumer_loop: asyncio.AbstractEventLoop | None = None


def attach_loop(loop: asyncio.AbstractEventLoop) -> None:
    """The event loop the consumers of this process run on (the in-memory layer's home)."""
    global _consumer_loop
    _consumer_loop = loop


# Sends on their way at once from the sender's loop: fewer than the connections redis-py
# gives one event loop (100), which refuses one more with MaxConnectionsError (a lost push);
# the others wait their turn on the loop. A send is one short round trip to Redis.
MAX_SENDS = 32


class _Sender:
    """An event loop on a daemon thread that sends pushes for the whole process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gate: asyncio.Semaphore | None = None
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
                self._gate = asyncio.Semaphore(MAX_SENDS)
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

    def send(self, coro: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        """Send ``coro`` (a channel-layer send) from the sender's own loop, at most
        ``MAX_SENDS`` at once."""
        loop = self.loop()
        with self._lock:
            gate = self._gate
        assert gate is not None

        async def gated() -> None:
            async with gate:
                await coro

        return self.submit(gated(), loop)

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
