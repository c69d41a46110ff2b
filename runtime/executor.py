"""Run one claimed attempt in this process: the agent SDK's one executor
(``holdpoint_client/executor.py``: steps, checkpoints at step boundaries, hold points,
pause, cancel, shutdown) on the run store (``runtime/backend.py``), with the heartbeat
thread beside it."""

from __future__ import annotations

import logging
import threading

from django.db import DatabaseError
from holdpoint_client.executor import Outcome, run_attempt

from runs.logcontext import bind
from runs.services import Lease
from runtime import registry
from runtime.backend import RunStoreBackend
from runtime.control import AttemptControl
from runtime.heartbeat import Heartbeater

__all__ = ["Outcome", "execute"]

logger = logging.getLogger("runtime")


def execute(
    lease: Lease,
    *,
    shutdown: threading.Event | None = None,
    control: AttemptControl | None = None,
    heartbeat: bool = True,
) -> Outcome:
    """Run the attempt ``lease`` until it ends; return how it ended.

    With ``heartbeat`` a separate thread renews the lease every ``lease_seconds / 3``.
    """
    control = control or AttemptControl(lease, shutdown)
    beater = Heartbeater(control) if heartbeat else None
    if beater is not None:
        beater.start()
    try:
        # Every log line of this attempt, in this thread, carries its run and attempt ids.
        with bind(run_id=lease.run_id, attempt_id=lease.attempt_id):
            agent = registry.get_agent(lease.agent)
            try:
                backend = RunStoreBackend(control, agent)
            except DatabaseError as exc:
                logger.exception("attempt %s: giving up the attempt: %s", lease.attempt_id, exc)
                outcome = Outcome.ABANDONED
            else:
                outcome = run_attempt(agent, backend, gone=(DatabaseError,))
    finally:
        if beater is not None:
            beater.stop()
    logger.info(
        "attempt %s (run %s, %s #%d): %s",
        lease.attempt_id,
        lease.run_id,
        lease.agent,
        lease.number,
        outcome,
    )
    return outcome
