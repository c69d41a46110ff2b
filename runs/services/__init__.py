"""The only writers of run state. See docs/architecture.md (the run model)."""

from __future__ import annotations

from runs.services._base import (
    UserLike,
    actor_for,
    error_fingerprint,
    lock_for_worker_write,
    lock_run,
    session_identity,
    user_or_none,
)
from runs.services.agents import (
    Declared,
    agent_declare,
    agent_owners_set,
    agents_declaring_tool,
    declared_tool_of,
)
from runs.services.approvals import register_tool_facts
from runs.services.control import (
    register_retry_guard,
    retry_blockers,
    run_cancel,
    run_resume,
    run_retry,
)
from runs.services.failures import attempt_fail, retry_budget
from runs.services.lifecycle import (
    MAX_HEARTBEAT_BATCH,
    WORKER_ID_MAX_LENGTH,
    Heartbeat,
    Lease,
    attempt_claim,
    attempt_complete,
    attempt_heartbeat,
    attempt_interrupt,
    attempt_log,
    attempt_release,
    attempts_heartbeat,
    checkpoint_save,
    run_start,
)
from runs.services.pause import agent_pause, agent_unpause, run_pause
from runs.services.sweeps import (
    backoffs_due,
    history_purge,
    leases_expire,
    register_sweep,
    requests_expire,
    sweep_all,
)
from runs.services.workers import worker_seen, worker_stopped, workers_sweep

__all__ = [
    "MAX_HEARTBEAT_BATCH",
    "WORKER_ID_MAX_LENGTH",
    "Declared",
    "Heartbeat",
    "Lease",
    "UserLike",
    "actor_for",
    "agent_declare",
    "agent_owners_set",
    "agent_pause",
    "agent_unpause",
    "agents_declaring_tool",
    "attempt_claim",
    "attempt_complete",
    "attempt_fail",
    "attempt_heartbeat",
    "attempt_interrupt",
    "attempt_log",
    "attempt_release",
    "attempts_heartbeat",
    "backoffs_due",
    "checkpoint_save",
    "declared_tool_of",
    "error_fingerprint",
    "history_purge",
    "leases_expire",
    "lock_for_worker_write",
    "lock_run",
    "register_retry_guard",
    "register_sweep",
    "register_tool_facts",
    "requests_expire",
    "retry_blockers",
    "retry_budget",
    "run_cancel",
    "run_pause",
    "run_resume",
    "run_retry",
    "run_start",
    "session_identity",
    "sweep_all",
    "user_or_none",
    "worker_seen",
    "worker_stopped",
    "workers_sweep",
]
