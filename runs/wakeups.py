"""Wake long-polling claims when work arrives: the same ``NOTIFY holdpoint_work`` the
in-process workers listen to (``runs/events.py``), heard once per process; and wake a
watching worker when its run is cancelled or paused (``holdpoint_cancel`` /
``holdpoint_pause``, by attempt id).

``POST /api/worker/claim`` with ``wait`` holds the request until an attempt is due or the
wait is over. Rather than one ``LISTEN`` connection per waiting request, one daemon
thread per process listens on a dedicated connection. Each waiting request holds a
``Ticket`` (which agents it may claim) for its whole wait, claims, and if nothing was due,
waits until its ticket is woken (or for a short poll interval, which catches backoffs
coming due and notifications sent while the listener was reconnecting).

A ``NOTIFY holdpoint_work`` names the agent of one attempt that became due, so it wakes
**one** waiting claim that may take it, not all of them: with hundreds of claims waiting
in a process, waking all made hundreds of claim queries per notice for one attempt, and
held the pool of database connections (issue 27). A claim that got a lease wakes the next
waiting claim of that agent (one transaction may have made several attempts due under one
notice: PostgreSQL folds identical notices), and a woken claim that leaves without looking
(its wait over, its worker gone) hands its wake-up on. A wake-up between "nothing to
claim" and "wait" is never lost: the ticket is held before the claim, and a ticket woken
meanwhile does not wait.

In-process changes (``on_run_changed``) wake every waiter when no listener hears the
notices (SQLite, or the listener reconnecting), so SQLite and the tests' own transactions
work without one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connections

from runs.db import postgresql
from runs.events import (
    CANCEL_CHANNEL,
    PAUSE_CHANNEL,
    WORK_CHANNEL,
    WORK_EVENTS,
    EventType,
    on_run_changed,
)

logger = logging.getLogger(__name__)

# Events after which a watch of the run's attempt answers: a cancel or pause its worker
# must hear of, or the end of the attempt (its watch has nothing left to wait for).
_STOP_EVENTS = frozenset(
    {
        EventType.RUN_CANCEL_REQUESTED,
        EventType.RUN_PAUSE_REQUESTED,
        EventType.AGENT_PAUSED,
        EventType.RUN_SUCCEEDED,
        EventType.ATTEMPT_FAILED,
        EventType.RUN_INTERRUPTED,
        EventType.ATTEMPT_RELEASED,
        EventType.ATTEMPT_LOST,
    }
)


@dataclass(eq=False)
class Ticket:
    """One waiting claim: which agents it may claim (``accepts``), and whether a notice woke
    it since it last looked (``woken``; ``woken_for``: the agent named, None for everyone)."""

    accepts: Callable[[str], bool]
    woken: bool = False
    woken_for: str | None = None


class WorkWaiter:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tickets: list[Ticket] = []  # waiting claims, oldest first
        # Cancel and pause signals, by attempt id (NOTIFY) or run id (in-process): a
        # watching worker (POST /api/worker/attempts/{id}/watch) wakes on either.
        self._signals: dict[str, int] = {}
        self._started = False
        self._start_lock = threading.Lock()
        self.listening = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Closed by stop() (tests): waits then poll without a listener until reopen().
        self._closed = False
        # Set when the server shuts down: every wait returns at once, so a long poll does
        # not hold the server's shutdown for its whole ``wait``.
        self.shutting_down = threading.Event()

    def release_waiters(self) -> None:
        """The server is stopping: wake every waiting claim and watch now, and let none
        wait again (they answer as if their time were up)."""
        with self._cond:
            self.shutting_down.set()
            self._cond.notify_all()

    def wake(self) -> None:
        """Wake every waiting claim (work whose agent is not known, a reconnection)."""
        with self._cond:
            for ticket in self._tickets:
                ticket.woken, ticket.woken_for = True, None
            self._cond.notify_all()

    def wake_one(self, agent: str) -> None:
        """An attempt of ``agent`` is due: wake the oldest waiting claim that may take it and
        is not woken already (if every such claim is, each looks again anyway)."""
        with self._cond:
            self._wake_one(agent)

    def _wake_one(self, agent: str) -> None:
        for ticket in self._tickets:
            if not ticket.woken and ticket.accepts(agent):
                ticket.woken, ticket.woken_for = True, agent
                self._cond.notify_all()
                return

    @contextlib.contextmanager
    def waiting(self, accepts: Callable[[str], bool]) -> Iterator[Ticket]:
        """Hold a ticket for a claim's whole wait (taken before its first look)."""
        self.ensure_started()
        ticket = Ticket(accepts)
        with self._cond:
            self._tickets.append(ticket)
        try:
            yield ticket
        finally:
            with self._cond:
                self._tickets.remove(ticket)
                if ticket.woken and ticket.woken_for is not None:
                    self._wake_one(ticket.woken_for)  # woken, but gone without looking

    def waiting_count(self) -> int:
        """How many claims wait in this process."""
        with self._cond:
            return len(self._tickets)

    def looking(self, ticket: Ticket) -> None:
        """The claim of ``ticket`` is about to look: what woke it is seen by this look."""
        with self._cond:
            ticket.woken, ticket.woken_for = False, None

    def wait_ticket(self, ticket: Ticket, timeout: float) -> None:
        """Wait up to ``timeout`` seconds unless ``ticket`` was woken since it last looked."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while not ticket.woken and not self.shutting_down.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    def signal(self, key: str) -> None:
        with self._cond:
            self._signals[key] = self._signals.get(key, 0) + 1
            if len(self._signals) > 10_000:  # old keys: nobody waits on them any more
                self._signals = {key: self._signals[key]}
            self._cond.notify_all()

    def signals(self, keys: tuple[str, ...]) -> int:
        with self._cond:
            return sum(self._signals.get(key, 0) for key in keys)

    def wait_signal(self, keys: tuple[str, ...], seen: int, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a cancel or pause signal on any of ``keys``."""
        self.ensure_started()
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while sum(self._signals.get(key, 0) for key in keys) == seen:
                if self.shutting_down.is_set():
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)

    @property
    def started(self) -> bool:
        return self._started

    def ensure_started(self) -> None:
        if self._started or self._closed:
            return
        with self._start_lock:
            if self._started or self._closed:
                return
            self._started = True
            on_run_changed(self._on_run_changed)
            self._stop.clear()
            if postgresql():
                self._thread = threading.Thread(
                    target=self._listen, name="holdpoint-claim-listener", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        """Close the listener's connection and start none until ``reopen()`` (tests: a
        claim still waiting in a server thread must not reopen one on a test database
        about to be dropped)."""
        with self._start_lock:
            self._closed = True
            self._stop.set()
            if self._thread is not None:
                self._thread.join(5)
            self._thread = None
            self._started = False
            self.listening.clear()

    def reopen(self) -> None:
        with self._start_lock:
            self._closed = False

    def _on_run_changed(self, run_id: str, event_type: str) -> None:
        if event_type in WORK_EVENTS:
            # With a listener, the commit's NOTIFY names the agent and wakes one claim.
            if not self.listening.is_set():
                self.wake()
        elif event_type in _STOP_EVENTS:
            self.signal(run_id)

    def _listen(self) -> None:
        def dispatch(channel: str, payload: str) -> None:
            if channel == WORK_CHANNEL:
                self.wake_one(payload)
            else:
                self.signal(payload)

        listen_for_changes(
            dispatch,
            stop=self._stop,
            listening=self.listening,
            on_connect=self.wake,  # Work queued while nobody listened: claim again now.
            who="claim listener",
        )


waiter = WorkWaiter()


def listen_connection_params() -> dict[str, Any]:
    """psycopg.connect's arguments for the LISTEN connection: ``DATABASE_LISTEN_URL``'s
    database when set (PostgreSQL itself, past PgBouncer's transaction pooling, which
    would hand NOTIFY to whichever client holds the server connection, or to none),
    else the default database's."""
    listen: dict[str, Any] | None = settings.DATABASE_LISTEN
    if listen is None:
        params = connections["default"].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        return params
    direct = {
        "dbname": listen["NAME"],
        "user": listen["USER"],
        "password": listen["PASSWORD"],
        "host": listen["HOST"],
        "port": listen["PORT"],
    }
    options: dict[str, Any] = dict(listen["OPTIONS"])
    options.pop("pool", None)
    return {**{k: v for k, v in direct.items() if v}, **options}


def listen_for_changes(
    dispatch: Callable[[str, str], None],
    *,
    stop: threading.Event,
    listening: threading.Event,
    on_connect: Callable[[], None],
    who: str,
) -> None:
    """LISTEN on the work, cancel and pause channels (``runs/events.py``) until ``stop``,
    calling ``dispatch(channel, payload)`` for each notice; ``listening`` is set while
    connected, and ``on_connect`` runs after each (re)connection, since what was notified
    meanwhile was missed. A lost connection is retried with backoff (0.5 s to 10 s).
    The one listener loop of the in-process workers and the long-polling claim."""
    import psycopg

    params = listen_connection_params()
    delay = 0.5
    while not stop.is_set():
        try:
            with psycopg.connect(**params, autocommit=True) as conn:
                for channel in (WORK_CHANNEL, CANCEL_CHANNEL, PAUSE_CHANNEL):
                    conn.execute(f"LISTEN {channel}")
                listening.set()
                delay = 0.5
                on_connect()
                while not stop.is_set():
                    for note in conn.notifies(timeout=0.5):
                        dispatch(note.channel, note.payload)
        except psycopg.Error as exc:
            listening.clear()
            logger.warning("%s: %s; reconnecting in %.1fs", who, exc, delay)
            stop.wait(delay)
            delay = min(delay * 2, 10.0)
    listening.clear()
