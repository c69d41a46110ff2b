"""The heartbeat thread: renews an attempt's lease every ``lease_seconds / 3``.

It runs beside the step, so a step that computes for a while (without calling
``ctx``) keeps its lease. Its answers reach the step through ``AttemptControl``:
``cancel_requested`` asks the step to stop at its next safe point, a refusal
``stale_worker`` means the lease is gone and the step must not write again.
"""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError, connection

from runs import services
from runs.errors import HoldpointError
from runs.logcontext import bind
from runs.services import Lease
from runtime.control import AttemptControl

logger = logging.getLogger("runtime")


class Heartbeater(threading.Thread):
    def __init__(self, control: AttemptControl, interval: float | None = None) -> None:
        super().__init__(name=f"heartbeat-{control.lease.attempt_id}", daemon=True)
        self.control = control
        self.interval = interval or max(0.05, control.lease.lease_seconds / 3)
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=10)

    def run(self) -> None:
        lease, control = self.control.lease, self.control
        with bind(run_id=lease.run_id, attempt_id=lease.attempt_id):
            self._beat(lease, control)

    def _beat(self, lease: Lease, control: AttemptControl) -> None:
        try:
            while not self._stopped.wait(self.interval):
                try:
                    beat = services.attempt_heartbeat(
                        attempt_id=lease.attempt_id,
                        lease_epoch=lease.lease_epoch,
                        lease_seconds=lease.lease_seconds,
                        cost=control.cost_arg(),
                    )
                except HoldpointError as exc:
                    if control.finishing.is_set() or self._stopped.is_set():
                        return  # The attempt ended on its own; the refusal is expected.
                    if exc.code in ("stale_worker", "stale_after_cancel", "not_found"):
                        control.mark_stale(f"heartbeat refused: {exc.code}: {exc.detail}")
                        return
                    logger.warning("attempt %s: heartbeat refused: %r", lease.attempt_id, exc)
                    continue
                except DatabaseError as exc:
                    # Keep trying: a short outage must not cost the lease. If it lasts past
                    # the lease, the fence refuses every later write anyway.
                    logger.warning("attempt %s: heartbeat failed: %s", lease.attempt_id, exc)
                    connection.close()
                    continue
                if beat.cancel_requested:
                    control.request_cancel("heartbeat")
                if beat.pause_requested:
                    control.request_pause("heartbeat")
        finally:
            connection.close()
