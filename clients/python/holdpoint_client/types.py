"""The values an agent's steps return and the errors they raise: the one definition, which
``runtime/sdk.py`` (in the server) and ``holdpoint_client`` export alike. No Django."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Next:
    """Go on with ``step``; the runtime saves ``state`` in a checkpoint first."""

    step: str
    state: Any = field(default_factory=dict)


@dataclass(frozen=True)
class Done:
    """The run succeeded with ``result`` (any JSON value)."""

    result: Any = None


@dataclass(frozen=True)
class Approval:
    """A person's answer to ``ctx.approve``. A denial is a value the agent acts on."""

    approved: bool
    comment: str = ""
    answered_by: str | None = None
    request_id: str = ""
    # Nobody was asked: the planned change was empty (every from equals its to). The step
    # goes on; it usually has nothing to do (the timeline says why).
    unchanged: bool = False
    # approve | deny | respond. A response ("send back with a comment") is not an approval:
    # ``approved`` is False and so ``denied`` is True; ``responded`` tells it apart.
    decision: str = ""
    # The arguments as the approvers edited them (``ctx.approve(..., editable=...)``), or
    # None when they approved the plan as it was.
    edited: Any = None
    # Everyone whose approval counted, when the policy needed more than one.
    approvers: tuple[str, ...] = ()

    @property
    def denied(self) -> bool:
        return not self.approved

    @property
    def responded(self) -> bool:
        return self.decision == "respond"


class StepError(Exception):
    """Base of the errors a step raises to say how its failure should be classified.

    Any other exception is classified by the agent's retry policy: transient,
    unless its type name is in ``non_retryable``.
    """

    failure_class: str | None = None


class Transient(StepError):
    """Worth retrying later (a timeout, a 503): back off and try again while budget lasts."""

    failure_class = "transient"


class Deterministic(StepError):
    """Retrying cannot help until something changes (bad input, a rejected change): stop."""

    failure_class = "deterministic"


class ApprovalDenied(StepError):
    """An irreversible side effect was denied by a person. Catch it to take another path;
    left uncaught, the run fails with class ``denied``."""

    failure_class = "denied"

    def __init__(self, message: str, *, approval: Approval) -> None:
        super().__init__(message)
        self.approval = approval


class EditRefused(StepError):
    """Raise it when the step cannot use the edit the approvers approved (``approval.edited``
    names a value that is gone, a combination the agent cannot carry out): nothing of the
    edit is done, and the runtime asks the same approval again (a new request on the same
    hold point, with the same plan), its context saying the edit was refused, who approved
    it and ``reason`` (``refused_edit``). Raised in a step that got no approved edit, the
    attempt fails (deterministic)."""

    failure_class = "deterministic"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = str(reason)


class ApprovalNotApplied(Deterministic):
    """The runtime's, never the agent's: the attempt was resumed with an approval, and its
    step ended (``ctx.next`` / ``ctx.done``) or skipped the approval (``unchanged``) without
    using it. The run fails saying what was approved, by whom, and why it was not applied;
    the approvers are told."""


class SideEffectFailed(StepError):
    """The external system refused the action: it certainly did not happen. Classified by
    the agent's policy (transient unless ``"SideEffectFailed"`` is ``non_retryable``); a
    retry acts again with the same idempotency key."""

    def __init__(self, message: str, *, operation_id: str, error: Any = None) -> None:
        super().__init__(message)
        self.operation_id = operation_id
        self.error = error


@dataclass(frozen=True)
class Confirmed:
    """What ``ctx.side_effect`` returns: the confirmed outcome as the ledger recorded it.

    ``decision`` says how it was reached: ``act`` (done now), ``look_up`` (an earlier
    attempt did it; the external system confirmed) or ``reuse`` (already recorded).
    """

    operation_id: str
    external_reference: str
    result: Any
    decision: str


class CostBudgetExceeded(Deterministic):
    """The run's cost went past the agent's ``cost_budget``."""


@dataclass(frozen=True)
class RetryPolicy:
    """How failures of an agent's attempts are retried automatically: the one definition
    (the server's run store judges failures by it, a remote agent sends it with its
    declaration, the harness backs off by it)."""

    max_attempts: int = 5
    backoff_initial: float = 1.0
    backoff_multiplier: float = 2.0
    backoff_max: float = 300.0
    # Full jitter on this fraction of the delay, so a crowd of failures does not retry in step.
    jitter: float = 0.2
    non_retryable: tuple[str, ...] = ()
    repeated_error_threshold: int = 3
    cost_budget: float | None = None
    max_lease_losses: int | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.repeated_error_threshold < 2:
            raise ValueError("repeated_error_threshold must be at least 2")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be between 0 and 1")
        if self.backoff_initial < 0 or self.backoff_max < 0 or self.backoff_multiplier < 1:
            raise ValueError("backoff must be non-negative and the multiplier at least 1")

    def backoff_seconds(self, failures: int, rng: random.Random | None = None) -> float:
        """Delay before the attempt that follows the ``failures``-th failure in a row."""
        base = min(
            self.backoff_max,
            self.backoff_initial * self.backoff_multiplier ** max(0, failures - 1),
        )
        spread = base * self.jitter
        return max(0.0, base - spread + (rng or random).random() * spread)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RetryPolicy:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown retry policy fields: {', '.join(sorted(unknown))}")
        values = dict(data)
        if "non_retryable" in values:
            values["non_retryable"] = tuple(values["non_retryable"])
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_attempts": self.max_attempts,
            "backoff_initial": self.backoff_initial,
            "backoff_multiplier": self.backoff_multiplier,
            "backoff_max": self.backoff_max,
            "jitter": self.jitter,
            "non_retryable": list(self.non_retryable),
            "repeated_error_threshold": self.repeated_error_threshold,
            "cost_budget": self.cost_budget,
            "max_lease_losses": self.max_lease_losses,
        }
