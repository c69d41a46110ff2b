"""Worker threads: claim due attempts, run them, sweep, and wake at once when work arrives.

``WorkerPool(concurrency, agents, stop_event)`` runs ``concurrency`` worker threads,
one sweeper thread and, on PostgreSQL, one listener thread on a dedicated
connection (``LISTEN holdpoint_work, holdpoint_cancel``). The same pool runs inside
``manage.py runagents`` and inside the single-process mode next to the web server.

How an idle worker learns of work, fastest first:

- in the same process, the run store's after-commit signal (``on_run_changed``);
- on PostgreSQL, ``NOTIFY holdpoint_work`` sent at commit by any process;
- a backoff that comes due: an idle worker waits only until the next ``not_before``;
- polling: every ``poll_interval`` seconds (0.5 s without a listener, 5 s with one,
  to catch notifications sent while the listener was reconnecting).

A cancel reaches the worker holding the lease the same ways (``run.cancel_requested``
in-process, ``NOTIFY holdpoint_cancel`` with the attempt id), and at worst at the
next heartbeat. So does a pause (``run.pause_requested`` or ``agent.paused``
in-process, ``NOTIFY holdpoint_pause``); it is honoured at the next step boundary.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable

from django.db import DatabaseError, connection

from runs import services
from runs.db import postgresql
from runs.events import (
    CANCEL_CHANNEL,
    PAUSE_CHANNEL,
    WORK_CHANNEL,
    WORK_EVENTS,
    EventType,
    on_run_changed,
    remove_run_changed,
)
from runs.wakeups import listen_for_changes
from runs.workers import PROCESS, TOUCH_SECONDS, Identity, default_lease_seconds
from runtime import registry
from runtime.control import AttemptControl
from runtime.executor import execute
from runtime.selectors import seconds_until_due

logger = logging.getLogger("runtime")


class Waker:
    """Wakes idle workers. A generation counter means a wake-up that arrives between
    "nothing to claim" and "wait" is not lost."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0

    @property
    def generation(self) -> int:
        with self._cond:
            return self._generation

    def wake(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> None:
        with self._cond:
            if self._generation == seen:
                self._cond.wait(timeout)


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _version() -> str:
    try:
        return importlib.metadata.version("holdpoint")
    except importlib.metadata.PackageNotFoundError:
        return ""


class WorkerPool:
    """``concurrency`` worker threads plus a sweeper (and a listener on PostgreSQL).

    ``stop_event``, when given, is the pool's shutdown signal: setting it (or calling
    ``stop()``) makes every worker finish its current step, release its lease so
    another worker goes on from the checkpoint, and exit.
    """

    def __init__(
        self,
        concurrency: int = 1,
        agents: Iterable[str] | None = None,
        stop_event: threading.Event | None = None,
        *,
        lease_seconds: float | None = None,
        poll_interval: float | None = None,
        sweep: bool = True,
        sweep_interval: float = 1.0,
        listen: bool = True,
        name: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        known = registry.agent_names()
        wanted = list(agents) if agents else known
        unknown = sorted(set(wanted) - set(known))
        if unknown:
            raise ValueError(
                f"No agent named {', '.join(unknown)} is registered here; "
                f"the registered agents are {', '.join(known) or 'none'}."
            )
        # Only agents this process can run: agents declared for HTTP workers are theirs.
        self.agents = sorted(wanted)
        self.concurrency = concurrency
        self.shutdown = stop_event if stop_event is not None else threading.Event()
        self.lease_seconds = lease_seconds
        self.listen = listen and postgresql()
        self.poll_interval = poll_interval or (5.0 if self.listen else 0.5)
        self.sweep = sweep
        self.sweep_interval = sweep_interval
        self.name = name or default_worker_name()
        self.waker = Waker()
        self.listening = threading.Event()
        self._active: dict[str, AttemptControl] = {}
        self._active_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._workers: list[threading.Thread] = []

    # Life cycle ----------------------------------------------------------------------

    def start(self) -> WorkerPool:
        on_run_changed(self._on_run_changed)
        if self.listen:
            self._spawn("listener", self._listen_loop)
        if self.sweep:
            self._spawn("sweeper", self._sweep_loop)
        # The Workers page lists this pool as a worker (runs/workers.py).
        self._spawn("presence", self._presence_loop)
        for index in range(1, self.concurrency + 1):
            self._workers.append(self._spawn(f"worker-{index}", self._work_loop, index))
        logger.info(
            "worker pool %s: %d workers for %s (lease %ss, %s)",
            self.name,
            self.concurrency,
            ", ".join(self.agents) or "no agents",
            self.lease_seconds or "default",
            "LISTEN/NOTIFY" if self.listen else f"polling every {self.poll_interval}s",
        )
        return self

    def _spawn(self, label: str, target: object, *args: object) -> threading.Thread:
        thread = threading.Thread(
            target=target,  # type: ignore[arg-type]
            args=args,
            name=f"holdpoint-{label}",
            daemon=True,
        )
        thread.start()
        self._threads.append(thread)
        return thread

    def alive(self) -> bool:
        return any(t.is_alive() for t in self._workers)

    def stop(self, timeout: float | None = None, force: threading.Event | None = None) -> None:
        """Stop gracefully: each worker finishes its current step and releases its lease.

        After ``timeout`` seconds (or when ``force`` is set) the leases still held are
        released at once; the steps still running are abandoned (their writes are
        refused from then on) and another worker repeats them from their checkpoints.
        """
        self.shutdown.set()
        self.waker.wake()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._workers:
            while thread.is_alive():
                if force is not None and force.is_set():
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                thread.join(0.1)
        self._release_all()
        for thread in self._threads:
            if thread not in self._workers:
                thread.join(2)
        remove_run_changed(self._on_run_changed)
        try:
            services.worker_stopped(principal=PROCESS, name=self.identity().name)
        except DatabaseError as exc:
            logger.warning("worker pool %s: could not say it stopped: %s", self.name, exc)
        finally:
            connection.close()

    def _release_all(self) -> None:
        with self._active_lock:
            controls = list(self._active.values())
        for control in controls:
            # Abandon the step first, so it writes nothing after the release.
            control.mark_stale("worker stopping before the step finished")
            try:
                services.attempt_release(
                    attempt_id=control.lease.attempt_id,
                    lease_epoch=control.lease.lease_epoch,
                    reason="shutdown",
                )
                logger.info("attempt %s released at shutdown", control.lease.attempt_id)
            except Exception as exc:  # noqa: BLE001 - shutdown goes on; the lease runs out instead
                logger.warning("attempt %s: release failed: %s", control.lease.attempt_id, exc)

    # Signals -------------------------------------------------------------------------

    def _on_run_changed(self, run_id: str, event_type: str) -> None:
        if event_type in WORK_EVENTS:
            self.waker.wake()
        elif event_type == EventType.RUN_CANCEL_REQUESTED:
            with self._active_lock:
                controls = [c for c in self._active.values() if c.lease.run_id == run_id]
            for control in controls:
                control.request_cancel("in-process signal")
        elif event_type in (EventType.RUN_PAUSE_REQUESTED, EventType.AGENT_PAUSED):
            with self._active_lock:
                controls = [c for c in self._active.values() if c.lease.run_id == run_id]
            for control in controls:
                control.request_pause("in-process signal")

    def pause_attempt(self, attempt_id: str, source: str = "notification") -> bool:
        with self._active_lock:
            control = self._active.get(attempt_id)
        if control is None:
            return False
        control.request_pause(source)
        return True

    def cancel_attempt(self, attempt_id: str, source: str = "notification") -> bool:
        with self._active_lock:
            control = self._active.get(attempt_id)
        if control is None:
            return False
        control.request_cancel(source)
        return True

    def active_attempts(self) -> list[str]:
        with self._active_lock:
            return list(self._active)

    # Threads -------------------------------------------------------------------------

    def _work_loop(self, index: int) -> None:
        worker_id = f"{self.name}/{index}"
        try:
            while not self.shutdown.is_set():
                seen = self.waker.generation
                try:
                    lease = services.attempt_claim(
                        worker_id=worker_id, agents=self.agents, lease_seconds=self.lease_seconds
                    )
                except DatabaseError as exc:
                    logger.warning("%s: claim failed: %s", worker_id, exc)
                    connection.close()
                    self.shutdown.wait(1.0)
                    continue
                if lease is None:
                    self.waker.wait(seen, self._idle_timeout())
                    continue
                control = AttemptControl(lease, self.shutdown)
                with self._active_lock:
                    self._active[lease.attempt_id] = control
                try:
                    execute(lease, control=control)
                except Exception:
                    logger.exception("%s: attempt %s crashed", worker_id, lease.attempt_id)
                    connection.close()
                finally:
                    with self._active_lock:
                        self._active.pop(lease.attempt_id, None)
        finally:
            connection.close()

    def _idle_timeout(self) -> float:
        """Wait until the next backoff is due, at most ``poll_interval``: a due attempt is
        claimed at once even when no notification and no sweep announces it."""
        try:
            due = seconds_until_due(self.agents)
        except DatabaseError:
            connection.close()
            return self.poll_interval
        if due is None:
            return self.poll_interval
        # A small floor: another worker may be claiming the due attempt right now.
        return min(self.poll_interval, max(due, 0.05))

    def identity(self) -> Identity:
        """Who this pool is, for the Workers page: in process, its name, host and pid."""
        return Identity(
            name=self.name[:100],
            principal=PROCESS,
            kind="process",
            client="holdpoint-runtime",
            client_version=_version(),
            host=socket.gethostname()[:200],
            pid=os.getpid(),
            concurrency=self.concurrency,
            agents=tuple(self.agents[:100]),
            lease_seconds=self.lease_seconds or default_lease_seconds(),
            wait_seconds=self.poll_interval,
        )

    def _presence_loop(self) -> None:
        """Say the pool is here, written every ``TOUCH_SECONDS`` (whether its threads are
        idle or busy); ``stop`` says it left."""
        identity = self.identity()
        try:
            while not self.shutdown.is_set():
                try:
                    services.worker_seen(identity=identity)
                except DatabaseError:
                    connection.close()
                self.shutdown.wait(TOUCH_SECONDS / 2)
        finally:
            connection.close()

    def _sweep_loop(self) -> None:
        try:
            while not self.shutdown.wait(self.sweep_interval):
                try:
                    report = services.sweep_all()
                except DatabaseError as exc:
                    logger.warning("sweep failed: %s", exc)
                    connection.close()
                    continue
                except Exception:
                    logger.exception("sweep failed")
                    continue
                if report.total:
                    logger.info(
                        "swept: %d leases expired, %d requests expired, %d backoffs due %s",
                        report.leases_expired,
                        report.requests_expired,
                        report.backoffs_due,
                        report.other or "",
                    )
        finally:
            connection.close()

    def _listen_loop(self) -> None:
        listen_for_changes(
            self._dispatch,
            stop=self.shutdown,
            listening=self.listening,
            # Work queued while nobody listened is found by a claim right away.
            on_connect=self.waker.wake,
            who="listener",
        )

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel == WORK_CHANNEL:
            if not payload or payload in self.agents:
                self.waker.wake()
        elif channel == CANCEL_CHANNEL:
            self.cancel_attempt(payload, "NOTIFY")
        elif channel == PAUSE_CHANNEL:
            self.pause_attempt(payload, "NOTIFY")
