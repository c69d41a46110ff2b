"""What a running attempt shares with its heartbeat thread: the lease, the stop signals,
the cost so far, and the one path by which the attempt writes to the server.

The fence is the server's: a write with an old ``lease_epoch`` is refused
``stale_worker`` (another worker owns the run: write nothing more), one with an old
``cancel_epoch`` ``stale_after_cancel`` (acknowledge the cancel). On top of that the
client never acts on a lease it cannot vouch for: if no heartbeat succeeded for the
lease's length (the server was away), the lease is taken as lost before any tool acts.
"""

from __future__ import annotations

import logging
import threading
import time
from decimal import Decimal
from typing import Any

from holdpoint_client.http import Api, Problem, ServerAway

logger = logging.getLogger("holdpoint_client")

# The share of the lease after which, without a successful renewal, the lease is
# taken as lost (the server's clock may be ahead of ours by a little).
LEASE_TRUST = 0.8


class Unwind(BaseException):
    """Unwinds a step; a ``BaseException`` so that ``except Exception`` does not swallow it."""


class HoldPointReached(Unwind):
    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.request_id = request_id


class CancelRequested(Unwind):
    """The run was cancelled: stop here and acknowledge with a release."""


class LeaseLost(Unwind):
    """Another worker owns the run now (or the lease cannot be vouched for): stop, write nothing."""


class SideEffectUnknown(Unwind):
    def __init__(self, message: str, *, operation_id: str) -> None:
        super().__init__(message)
        self.message = message
        self.operation_id = operation_id


class AttemptControl:
    def __init__(self, api: Api, lease: dict[str, Any], shutdown: threading.Event) -> None:
        self.api = api
        self.lease = lease
        self.shutdown = shutdown
        self.cancel = threading.Event()
        self.stale = threading.Event()
        self.pause = threading.Event()
        self.wake = threading.Event()
        self.finishing = threading.Event()
        self.stale_reason = ""
        self.lease_seconds = float(lease["lease_seconds"])
        # When the last renewal that succeeded was *sent* (conservative).
        self.renewed_at = time.monotonic()
        self._cost = Decimal("0")
        self._lock = threading.Lock()

    @property
    def attempt_id(self) -> str:
        return str(self.lease["attempt_id"])

    # Signals -------------------------------------------------------------------------

    def request_cancel(self, source: str) -> None:
        if not self.cancel.is_set():
            logger.info("attempt %s: cancel requested (%s)", self.attempt_id, source)
        self.cancel.set()
        self.wake.set()

    def request_pause(self, source: str) -> None:
        if not self.pause.is_set():
            logger.info("attempt %s: pause requested (%s)", self.attempt_id, source)
        self.pause.set()

    def mark_stale(self, reason: str) -> None:
        if not self.stale.is_set():
            logger.warning("attempt %s: lease lost: %s", self.attempt_id, reason)
            self.stale_reason = reason
        self.stale.set()
        self.wake.set()

    def renewed(self, sent_at: float) -> None:
        with self._lock:
            self.renewed_at = max(self.renewed_at, sent_at)

    def lease_trusted(self) -> bool:
        with self._lock:
            return time.monotonic() - self.renewed_at < self.lease_seconds * LEASE_TRUST

    def check(self) -> None:
        """A safe point: unwind if the lease is gone (or unvouched) or the run was cancelled."""
        if not self.stale.is_set() and not self.lease_trusted():
            self.mark_stale("no renewal of the lease succeeded for its length")
        if self.stale.is_set():
            raise LeaseLost(self.stale_reason)
        if self.cancel.is_set():
            raise CancelRequested()

    # Cost ----------------------------------------------------------------------------

    def add_cost(self, amount: Decimal) -> Decimal:
        with self._lock:
            self._cost += amount
            return self._cost

    def cost_arg(self) -> str | None:
        with self._lock:
            return str(self._cost) if self._cost else None

    # Writes --------------------------------------------------------------------------

    def epochs(self) -> dict[str, Any]:
        return {
            "lease_epoch": self.lease["lease_epoch"],
            "cancel_epoch": self.lease["cancel_epoch"],
        }

    def write(self, action: str, body: dict[str, Any], *, with_cost: bool = True) -> Any:
        """POST a fenced write about this attempt; map the fence's refusals to unwinding."""
        self.check()
        payload = {**self.epochs(), **body}
        cost = self.cost_arg()
        if with_cost and cost is not None:
            payload["cost"] = cost
        try:
            _, data = self.api.call(
                "POST",
                f"/api/worker/attempts/{self.attempt_id}/{action}",
                payload,
                retry_for=self.lease_seconds * LEASE_TRUST,
            )
        except Problem as exc:
            if exc.code in ("stale_worker", "not_your_lease"):
                self.mark_stale(f"{action} refused ({exc.code}): {exc.detail}")
                raise LeaseLost(exc.detail) from exc
            if exc.code == "stale_after_cancel":
                self.request_cancel(f"{action} refused ({exc.code})")
                raise CancelRequested() from exc
            raise
        except ServerAway as exc:
            self.mark_stale(f"{action}: the server did not answer: {exc}")
            raise LeaseLost(str(exc)) from exc
        return data

    def outcome(self, operation_id: str, body: dict[str, Any]) -> Any:
        """Record what a tool did. Never fenced (an outcome is a fact), so it is sent even
        after the lease was lost, and retried until the server takes it."""
        _, data = self.api.call(
            "POST",
            f"/api/worker/side-effects/{operation_id}/outcome",
            {**body, **self.epochs()},
            retry_for=300.0,
            persist=True,
        )
        return data

    def release(self, reason: str) -> dict[str, Any] | None:
        try:
            _, data = self.api.call(
                "POST",
                f"/api/worker/attempts/{self.attempt_id}/release",
                {"lease_epoch": self.lease["lease_epoch"], "reason": reason},
                retry_for=10.0,
                persist=True,
            )
            return data if isinstance(data, dict) else {}
        except (Problem, ServerAway) as exc:
            logger.info("attempt %s: release refused: %s", self.attempt_id, exc)
            return None


# The longest a watch waits for a cancel or pause (under the HTTP client's timeout).
WATCH_MAX = 25.0


class Heartbeater:
    """Renews the lease every ``heartbeat_seconds`` and hears cancel and pause at once.

    Each renewal is a *watch* (``POST …/watch``): the server renews the lease, then holds
    the request until the run is cancelled or paused (its NOTIFY) or the interval is
    over; so the next renewal follows the answer, and a cancel arrives without waiting
    for the next heartbeat. Once a cancel or pause is known, plain renewals follow.
    """

    def __init__(self, control: AttemptControl) -> None:
        self.control = control
        self.every = float(control.lease.get("heartbeat_seconds") or control.lease_seconds / 3)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"hp-heartbeat-{control.attempt_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        # A watch in flight is answered when the attempt ends (the server wakes it).
        self._thread.join(0.2)

    def _run(self) -> None:
        control = self.control
        while not self._stop.is_set():
            known = control.cancel.is_set() or control.pause.is_set()
            if known and self._stop.wait(self.every):
                return
            wait = 0.0 if known else min(self.every, WATCH_MAX)
            sent_at = time.monotonic()
            try:
                _, data = control.api.call(
                    "POST",
                    f"/api/worker/attempts/{control.attempt_id}/watch",
                    {
                        "lease_epoch": control.lease["lease_epoch"],
                        "lease_seconds": control.lease_seconds,
                        "cost": control.cost_arg(),
                        "wait": wait,
                    },
                    timeout=wait + 15.0,
                    retry_for=self.every,
                    persist=True,
                )
            except Problem as exc:
                if control.finishing.is_set() or self._stop.is_set():
                    return
                if exc.code in ("stale_worker", "not_your_lease", "not_found"):
                    control.mark_stale(f"heartbeat refused ({exc.code})")
                    return
                logger.warning("attempt %s: heartbeat refused: %s", control.attempt_id, exc)
                self._stop.wait(self.every)
                continue
            except ServerAway as exc:
                logger.warning("attempt %s: heartbeat: %s", control.attempt_id, exc)
                if not control.lease_trusted():
                    control.mark_stale("the server was away for the lease's length")
                    return
                continue
            control.renewed(sent_at)
            if data.get("cancel_requested"):
                control.request_cancel("heartbeat")
            if data.get("pause_requested"):
                control.request_pause("heartbeat")
