"""An attempt's control in the server's process: the agent SDK's one ``AttemptControl``
(``holdpoint_client/control.py``: the signals, the safe point, the cost) holding the run
store's ``Lease``. The heartbeat thread and the notification listener of ``worker.py``
set its signals; the fence of the run store decides the rest."""

from __future__ import annotations

import threading

from holdpoint_client.control import (
    AttemptControl as SdkControl,
)
from holdpoint_client.control import (
    CancelRequested,
    HoldPointReached,
    LeaseLost,
    SideEffectUnknown,
    StepTimeout,
    Unwind,
)

from runs.services import Lease

__all__ = [
    "AttemptControl",
    "CancelRequested",
    "HoldPointReached",
    "LeaseLost",
    "SideEffectUnknown",
    "StepTimeout",
    "Unwind",
]


class AttemptControl(SdkControl):
    """The shared, thread-safe state of one attempt while a worker of this process holds
    its lease."""

    def __init__(self, lease: Lease, shutdown: threading.Event | None = None) -> None:
        super().__init__(lease.attempt_id, shutdown)
        self.lease = lease
