"""The run lifecycle: every allowed transition, in one table.

Services ask ``next_status(current, operation)``; anything not in the table is
refused with ``invalid_state``. docs/architecture.md draws it.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from runs.errors import HoldpointError


class RunStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    INPUT_REQUIRED = "input_required", _("Waiting for input")
    AUTH_REQUIRED = "auth_required", _("Waiting for approval")
    WAITING = "waiting", _("Backing off")
    CANCEL_REQUESTED = "cancel_requested", _("Cancelling…")
    PAUSE_REQUESTED = "pause_requested", _("Pausing…")
    PAUSED = "paused", _("Paused")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


class AttemptStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    INTERRUPTED = "interrupted", _("Interrupted")
    SUCCEEDED = "succeeded", _("Succeeded")
    FAILED = "failed", _("Failed")
    ABORTED = "aborted", _("Aborted")
    LOST = "lost", _("Lost")


class AttemptReason(models.TextChoices):
    INITIAL = "initial", _("Initial")
    RESUME = "resume", _("Resume")
    RETRY = "retry", _("Retry")
    AUTO_RETRY = "auto_retry", _("Automatic retry")
    LEASE_EXPIRED = "lease_expired", _("Lease expired")
    # The agent's gate closed at a step boundary; the attempt goes on when it reopens.
    HELD = "held", _("Held by an agent pause")
    # Its worker shut down gracefully and gave the lease back (release, reason shutdown).
    RELEASED = "released", _("Handed over by a stopping worker")


class FailureClass(models.TextChoices):
    TRANSIENT = "transient", _("Transient")
    DETERMINISTIC = "deterministic", _("Deterministic")
    REPEATED_ERROR = "repeated_error", _("Repeated error")
    LEASE_LOST = "lease_lost", _("Lease lost")
    SIDE_EFFECT_UNKNOWN = "side_effect_unknown", _("Side effect unknown")
    INPUT_EXPIRED = "input_expired", _("Input expired")
    DENIED = "denied", _("Denied")
    CANCELLED = "cancelled", _("Cancelled")


class RequestKind(models.TextChoices):
    INPUT_REQUIRED = "input_required", _("Input")
    AUTH_REQUIRED = "auth_required", _("Approval")
    PAUSE = "pause", _("Pause")


class RequestStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    ANSWERED = "answered", _("Answered")
    EXPIRED = "expired", _("Expired")
    CANCELLED = "cancelled", _("Cancelled")


S = RunStatus

# (current status, operation) -> new status.
TRANSITIONS: dict[tuple[str, str], str] = {
    (S.QUEUED, "claim"): S.RUNNING,
    (S.WAITING, "claim"): S.RUNNING,  # a due backoff is claimable without waiting for a sweep
    (S.RUNNING, "interrupt_input"): S.INPUT_REQUIRED,
    (S.RUNNING, "interrupt_auth"): S.AUTH_REQUIRED,
    (S.RUNNING, "complete"): S.SUCCEEDED,
    (S.RUNNING, "fail_retry"): S.WAITING,
    (S.RUNNING, "fail_stop"): S.FAILED,
    (S.RUNNING, "lease_expired_retry"): S.QUEUED,
    (S.RUNNING, "lease_expired_stop"): S.FAILED,
    (S.RUNNING, "release_shutdown"): S.QUEUED,
    (S.INPUT_REQUIRED, "resume"): S.QUEUED,
    (S.AUTH_REQUIRED, "resume"): S.QUEUED,
    (S.INPUT_REQUIRED, "expire"): S.FAILED,
    (S.AUTH_REQUIRED, "expire"): S.FAILED,
    (S.WAITING, "backoff_due"): S.QUEUED,
    # Cancel: with a live lease the worker must acknowledge; without one it is final at once.
    (S.RUNNING, "cancel_live"): S.CANCEL_REQUESTED,
    (S.RUNNING, "cancel"): S.CANCELLED,  # the lease has already run out
    (S.QUEUED, "cancel"): S.CANCELLED,
    (S.WAITING, "cancel"): S.CANCELLED,
    (S.INPUT_REQUIRED, "cancel"): S.CANCELLED,
    (S.AUTH_REQUIRED, "cancel"): S.CANCELLED,
    (S.CANCEL_REQUESTED, "cancel_done"): S.CANCELLED,
    (S.FAILED, "retry"): S.QUEUED,
    (S.CANCELLED, "retry"): S.QUEUED,
    # Pause: at once without a live lease; with one, the worker stops at its next step
    # boundary (the step commits normally: a pause is not a fence). Cancel always wins.
    (S.QUEUED, "pause"): S.PAUSED,
    (S.WAITING, "pause"): S.PAUSED,
    (S.RUNNING, "pause"): S.PAUSED,  # the lease has already run out
    (S.RUNNING, "pause_live"): S.PAUSE_REQUESTED,
    (S.RUNNING, "interrupt_pause"): S.PAUSED,  # a breakpoint before a step
    (S.PAUSE_REQUESTED, "interrupt_pause"): S.PAUSED,
    (S.PAUSE_REQUESTED, "pause_done"): S.PAUSED,  # released at a boundary, or the lease ended
    (S.PAUSE_REQUESTED, "interrupt_input"): S.INPUT_REQUIRED,  # a person answering continues
    (S.PAUSE_REQUESTED, "interrupt_auth"): S.AUTH_REQUIRED,
    (S.PAUSE_REQUESTED, "complete"): S.SUCCEEDED,  # the last step finished: nothing to pause
    (S.PAUSE_REQUESTED, "fail_stop"): S.FAILED,
    (S.PAUSE_REQUESTED, "lease_expired_stop"): S.FAILED,
    (S.PAUSE_REQUESTED, "cancel_live"): S.CANCEL_REQUESTED,
    (S.PAUSE_REQUESTED, "cancel"): S.CANCELLED,
    (S.PAUSED, "resume"): S.QUEUED,  # continue: a resume of the pause request
    (S.PAUSED, "cancel"): S.CANCELLED,
    (S.PAUSED, "expire"): S.FAILED,  # a pause given an expiry that nobody continued
    # The agent's gate is closed: the attempt stops at its boundary, the run waits queued.
    (S.RUNNING, "hold"): S.QUEUED,
}

# States whose current attempt a worker may claim (once it is due): read off the table.
CLAIMABLE = frozenset(status for (status, operation) in TRANSITIONS if operation == "claim")
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
# States in which a person is being asked something.
HOLDING = frozenset({S.INPUT_REQUIRED, S.AUTH_REQUIRED})
# States that a person's answer to the pending request continues (a pause is continued).
ANSWERABLE = HOLDING | {S.PAUSED}
# States in which a worker holds (or held) a lease on the current attempt.
LEASED = frozenset({S.RUNNING, S.CANCEL_REQUESTED, S.PAUSE_REQUESTED})


def _from(*operations: str) -> frozenset[str]:
    """The states from which the table allows one of ``operations``."""
    return frozenset(current for current, op in TRANSITIONS if op in operations)


# What a person may do to a run now, read off the table (the services refuse the rest; the
# dashboard offers only these buttons). A run already cancelling is not offered Cancel
# again (asking twice changes nothing, so the service accepts it quietly).
CANCELLABLE = _from("cancel", "cancel_live")
PAUSABLE = _from("pause", "pause_live")
RETRYABLE = _from("retry")
FINISHED_ATTEMPT = frozenset(
    {
        AttemptStatus.INTERRUPTED,
        AttemptStatus.SUCCEEDED,
        AttemptStatus.FAILED,
        AttemptStatus.ABORTED,
        AttemptStatus.LOST,
    }
)


def can(current: str, operation: str) -> bool:
    return (current, operation) in TRANSITIONS


def next_status(current: str, operation: str) -> str:
    try:
        return TRANSITIONS[(current, operation)]
    except KeyError:
        raise HoldpointError(
            "invalid_state",
            f"A run that is {current} cannot {operation.replace('_', ' ')}.",
            run_status=current,
            operation=operation,
        ) from None
