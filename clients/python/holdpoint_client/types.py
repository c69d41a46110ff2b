"""The values steps return and the errors they raise: the same names as ``runtime.sdk``'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Next:
    """Go on with ``step``; ``state`` is saved in a checkpoint first."""

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
    # Nobody was asked: the planned change was empty.
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


@dataclass(frozen=True)
class Confirmed:
    """What ``ctx.side_effect`` returns: the outcome the ledger recorded, and how it was
    reached (``act``, ``look_up`` or ``reuse``)."""

    operation_id: str
    external_reference: str
    result: Any
    decision: str


class StepError(Exception):
    """Base of the errors that say how a step's failure is classified; any other exception
    is classified by the agent's retry policy."""

    failure_class: str | None = None


class Transient(StepError):
    """Worth retrying later: back off and try again while the budget lasts."""

    failure_class = "transient"


class Deterministic(StepError):
    """Retrying cannot help until something changes: stop."""

    failure_class = "deterministic"


class ApprovalDenied(StepError):
    """An irreversible side effect was denied by a person."""

    failure_class = "denied"

    def __init__(self, message: str, *, approval: Approval) -> None:
        super().__init__(message)
        self.approval = approval


class SideEffectFailed(StepError):
    """The external system refused the action: it certainly did not happen."""

    def __init__(self, message: str, *, operation_id: str, error: Any = None) -> None:
        super().__init__(message)
        self.operation_id = operation_id
        self.error = error


class CostBudgetExceeded(Deterministic):
    """The run's cost went past the agent's ``cost_budget``."""


@dataclass(frozen=True)
class RetryPolicy:
    """How the server retries failed attempts of the agent (sent with its declaration)."""

    max_attempts: int = 5
    backoff_initial: float = 1.0
    backoff_multiplier: float = 2.0
    backoff_max: float = 300.0
    jitter: float = 0.2
    non_retryable: tuple[str, ...] = ()
    repeated_error_threshold: int = 3
    cost_budget: float | None = None
    max_lease_losses: int | None = None

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
