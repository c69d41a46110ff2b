"""What a running attempt and the threads around it share: the stop signals, the cost so
far, and the safe point every ``ctx`` call passes. One implementation for every backend.

A step runs in a worker thread; the heartbeat thread (and, in process, the notification
listener) set ``cancel`` or ``stale`` on the attempt's ``AttemptControl``; the step sees
them at its next safe point (any ``ctx`` call, or the step boundary). ``pause`` is seen
only at the step boundary: a pause is not a fence, the step finishes and commits.
``shutdown`` (SIGTERM; shared by every attempt of a worker) lets the step finish within
the grace, then the attempt is released for another worker.
"""

from __future__ import annotations

import logging
import threading
from decimal import Decimal

logger = logging.getLogger("holdpoint_client")


class Unwind(BaseException):
    """Unwinds a step. A ``BaseException`` so that an agent's ``except Exception``
    cannot swallow it by accident (the same choice as ``GeneratorExit``)."""


class HoldPointReached(Unwind):
    """The checkpoint and the question are saved; the attempt ends ``interrupted``."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.request_id = request_id


class CancelRequested(Unwind):
    """The run was cancelled: stop here and acknowledge with a release."""


class LeaseLost(Unwind):
    """Another worker owns the run now (a write was refused ``stale_worker``, or the lease
    cannot be vouched for): stop without writing anything more (outcomes of external
    actions excepted)."""


class StepTimeout(Unwind):
    """The step ran past its ``timeout`` (``@agent.step(timeout=…)``) and was stopped at a
    safe point. The attempt fails ``transient`` with error type ``StepTimeout``; an
    agent's ``except Exception`` cannot swallow it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SideEffectUnknown(Unwind):
    """Whether an external action happened is unknown. The attempt fails with class
    ``side_effect_unknown`` and automatic retries stop until it is reconciled; an agent
    cannot catch this and carry on as if it knew."""

    def __init__(self, message: str, *, operation_id: str) -> None:
        super().__init__(message)
        self.message = message
        self.operation_id = operation_id


class AttemptControl:
    """The shared, thread-safe state of one attempt while a worker holds its lease."""

    def __init__(self, attempt_id: str, shutdown: threading.Event | None = None) -> None:
        self.attempt_id = attempt_id
        self.cancel = threading.Event()
        self.stale = threading.Event()
        # Stop at the next step boundary (the run was paused, or its agent's gate closed).
        self.pause = threading.Event()
        # Shared by all attempts of a worker: finish the current step, then release.
        self.shutdown = shutdown if shutdown is not None else threading.Event()
        # Set whenever cancel or stale is: wakes a step sleeping in ctx.sleep at once.
        self.wake = threading.Event()
        # Set before the final write (complete, fail, interrupt, release): from then on a
        # heartbeat that is refused because the attempt ended is expected, not news.
        self.finishing = threading.Event()
        self.stale_reason = ""
        self._cost = Decimal("0")
        self._lock = threading.Lock()

    # Signals -------------------------------------------------------------------------

    def request_cancel(self, source: str) -> None:
        if not self.cancel.is_set():
            logger.info("attempt %s: cancel requested (%s)", self.attempt_id, source)
        self.cancel.set()
        self.wake.set()

    def request_pause(self, source: str) -> None:
        """Stop at the next step boundary. Not a wake-up: the step runs to its end."""
        if not self.pause.is_set():
            logger.info("attempt %s: pause requested (%s)", self.attempt_id, source)
        self.pause.set()

    def mark_stale(self, reason: str) -> None:
        if not self.stale.is_set():
            logger.warning("attempt %s: lease lost: %s", self.attempt_id, reason)
            self.stale_reason = reason
        self.stale.set()
        self.wake.set()

    def vouch(self) -> None:
        """Mark the lease stale when this side can no longer vouch for it (the HTTP
        worker's reckoning of an unrenewed lease); in process the fence alone decides."""

    def check(self) -> None:
        """A safe point: unwind if the lease is gone or the run was cancelled."""
        if not self.stale.is_set():
            self.vouch()
        if self.stale.is_set():
            raise LeaseLost(self.stale_reason)
        if self.cancel.is_set():
            raise CancelRequested()

    # Cost ----------------------------------------------------------------------------

    def add_cost(self, amount: Decimal) -> Decimal:
        with self._lock:
            self._cost += amount
            return self._cost

    @property
    def cost(self) -> Decimal:
        with self._lock:
            return self._cost

    def cost_arg(self) -> str | None:
        cost = self.cost
        return str(cost) if cost else None
