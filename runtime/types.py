"""The values an agent's steps return and the errors they raise (``runtime/sdk.py`` exports them).

Nothing here imports the rest of the runtime or the run store.
"""

from __future__ import annotations

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
