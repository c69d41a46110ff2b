"""Wake long-polling claims when work arrives: the same ``NOTIFY holdpoint_work`` the
in-process workers listen to (``runs/events.py``), heard once per process; and wake a
watching worker when its run is cancelled or paused (``holdpoint_cancel`` /
``holdpoint_pause``, by attempt id).

``POST /api/worker/claim`` with ``wait`` holds the request until an attempt is due or the
wait is over. Rather than one ``LISTEN`` connection per waiting request, one daemon
thread per process listens on a dedicated connection and bumps a generation counter;
each waiting request claims, and if nothing was due, waits for the counter to move (or
for a short poll interval, which catches backoffs coming due and notifications sent
while the listener was reconnecting). A wake-up between "nothing to claim" and "wait" is
never lost: the request waits only while the generation it saw before claiming is current.

In-process changes (``on_run_changed``) wake waiters too, so SQLite and the tests' own
transactions work without a listener.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connection, connections

from runs.events import CANCEL_CHANNEL, PAUSE_CHANNEL, WORK_CHANNEL, EventType, on_run_changed

logger = logging.getLogger(__name__)

# Events after which an attempt may be due (the same set the in-process workers wake on).
_WORK_EVENTS = frozenset(
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


class WorkWaiter:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0
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

    @property
    def generation(self) -> int:
        with self._cond:
            return self._generation

    def wake(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

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

    def wait(self, seen: int, timeout: float) -> None:
        """Wait up to ``timeout`` seconds unless the generation already moved past ``seen``."""
        self.ensure_started()
        with self._cond:
            if self._generation == seen and not self.shutting_down.is_set():
                self._cond.wait(max(0.0, timeout))

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
            if connection.vendor == "postgresql":
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
        if event_type in _WORK_EVENTS:
            self.wake()
        elif event_type in _STOP_EVENTS:
            self.signal(run_id)

    def _listen(self) -> None:
        def dispatch(channel: str, payload: str) -> None:
            if channel == WORK_CHANNEL:
                self.wake()
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

    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
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
