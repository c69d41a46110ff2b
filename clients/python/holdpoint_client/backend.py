"""What the one runtime (``context.py``, ``executor.py``) needs of the store under it.

The agent SDK is written once: the steps, ``ctx``, the executor of an attempt, its control
(cancel, pause, grace) and the tool interface. What sits under it is a ``Backend``, one per
attempt, and there are three (the way Temporal's SDK runs one workflow code against a
server or a time-skipping test environment):

- ``holdpoint_client/remote.py``: the HTTP worker protocol (``holdpoint-worker``);
- ``runtime/backend.py`` in the server: the run store in process (``manage.py runagents``);
- ``holdpoint_client/testing.py``: an in-memory store on a fake clock (``run_agent``).

A backend carries out writes (each fenced by the attempt's epochs where the store has
them), answers the few questions whose answer depends on where the run lives (which tool a
name means, what an approver may edit), and keeps time. It never decides what a step may
do: those rules are the runtime's, above it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from holdpoint_client.control import AttemptControl
from holdpoint_client.tools import Tool

MAX_KEY_LENGTH = 100  # InputRequest.step_id and SideEffect.step_id
_KEY_DIGEST = 20


def step_key(step: str, kind: str, key: str | None, count: int) -> str:
    """The key of a hold point or side effect within a step run: ``<step>.<kind>`` for the
    first call of a kind, ``<step>.<kind>#<n>`` for the n-th, or ``<step>.<key>`` when the
    call names one. ``key=""`` is refused (``ValueError``): an empty name is a mistake,
    never "no key" (the TypeScript client's rule too). The one home of this rule."""
    if key is not None:
        if not isinstance(key, str) or not key:
            raise ValueError("key must not be empty")  # the words of every client (conformance)
        return hold_point_key(f"{step}.{key}")
    return hold_point_key(f"{step}.{kind}" if count == 1 else f"{step}.{kind}#{count}")


def hold_point_key(raw: str) -> str:
    """``raw`` when it fits in the 100 characters a hold point keeps; else its start and a
    hash of all of it. Cutting at 100 characters would make two keys that share their first
    100 characters one key, and an answer or a side effect of one would be taken for the
    other."""
    if len(raw) <= MAX_KEY_LENGTH:
        return raw
    digest = hashlib.sha256(raw.encode("utf-8")).hexdigest()[:_KEY_DIGEST]
    return f"{raw[: MAX_KEY_LENGTH - _KEY_DIGEST - 1]}~{digest}"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def to_json(value: Any, what: str) -> Any:
    """Return ``value`` as it will come back from the store, or raise ``TypeError``."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"The {what} must be JSON: {exc}") from None


# Secret header values are never stored (the server's ``ledger/outbound.py`` redacts them
# by the same words): an editable request shows the placeholder, an approver's edit gets
# the real values back from the plan the step holds in memory, and an approval covers a
# call whatever secret it carries.
REDACTED = "[redacted]"
_SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key"}
)
_SECRET_WORDS = ("token", "secret", "key", "password", "passwd", "auth", "session", "signature")


def _is_secret_header(name: str) -> bool:
    lowered = name.lower()
    return lowered in _SECRET_HEADERS or any(word in lowered for word in _SECRET_WORDS)


def redact_request(request: Any) -> Any:
    """``request`` with secret header values replaced by ``[redacted]``."""
    if not (isinstance(request, dict) and isinstance(request.get("headers"), dict)):
        return request
    headers = {
        name: REDACTED if isinstance(name, str) and _is_secret_header(name) else value
        for name, value in request["headers"].items()
    }
    return {**request, "headers": headers}


def with_secrets(edited: Any, planned: Any) -> Any:
    """An approver's edit of a request, with the secret header values the card showed
    redacted put back from the plan (the store never had them)."""
    if not (isinstance(edited, dict) and isinstance(planned, dict)):
        return edited
    headers, original = edited.get("headers"), planned.get("headers")
    if not (isinstance(headers, dict) and isinstance(original, dict)):
        return edited
    restored = {
        name: original[name] if value == REDACTED and name in original else value
        for name, value in headers.items()
    }
    return {**edited, "headers": restored}


@dataclass(frozen=True)
class Answer:
    """A person's answer to a hold point, as a step sees it when it runs again."""

    request_id: str
    kind: str
    step_id: str
    value: Any
    answered_by: str | None
    context: dict[str, Any]
    # What an approval showed (tool, target, change): it covers that action only.
    action: dict[str, Any] = field(default_factory=dict)


def covers(answer: Answer, *, tool: str, target: str, change: Any) -> bool:
    """Whether the answered approval was asked about exactly this action as planned (tool,
    target and request, secrets redacted: the ledger's ``action_hash``)."""
    action = answer.action or {}
    return (
        bool(action.get("tool"))
        and str(action.get("tool", "")) == tool
        and str(action.get("target", "")) == target
        and canonical_json(redact_request(action.get("change")))
        == canonical_json(redact_request(change))
    )


@dataclass(frozen=True)
class AttemptLease:
    """What the runtime needs of the attempt a worker holds, whichever store granted it."""

    run_id: str
    attempt_id: str
    agent: str
    number: int
    reason: str
    input: Any
    # Hold-point keys approved when the run was started.
    approvals: tuple[str, ...] = ()
    # {step, state, checkpoint_id} of the checkpoint this attempt resumes from, or None.
    resume_from: dict[str, Any] | None = None
    # The answered request the attempt resumes with (what people approved, issue 24).
    resume_request: dict[str, Any] | None = None
    # Breakpoints: pause at the boundary before each of these steps.
    pause_before: tuple[str, ...] = ()
    # What the run's earlier attempts cost, for the agent's cost budget.
    run_cost: Decimal = Decimal(0)
    # The answers the first step may use, by hold-point key (the matching rule).
    answers: dict[str, Answer] = field(default_factory=dict)
    agent_version: int | None = None


@dataclass(frozen=True)
class Begin:
    """The ledger's decision on a side effect about to act: ``act``, ``look_up`` or
    ``reuse`` (with the recorded result), and the key the tool must pass on."""

    decision: str
    operation_id: str
    idempotency_key: str
    external_reference: str = ""
    result: Any = None
    # The request the tool is given: the plan, or the approvers' edit of it.
    request: Any = None


@dataclass(frozen=True)
class Effect:
    """An outcome the ledger recorded."""

    operation_id: str
    status: str
    external_reference: str = ""
    result: Any = None
    error: Any = None


@dataclass(frozen=True)
class Report:
    """What became of a side effect, for the ledger to record: ``confirmed`` (the tool's
    reference and result), ``failed`` (it certainly did not happen) or ``unknown``, with
    the error."""

    status: str
    external_reference: str | None = None
    result: Any = None
    error: Any = None


@dataclass(frozen=True)
class HoldPoint:
    """A hold point to save on the checkpoint a step started from: a question
    (``input_required``), an approval (``auth_required``, with its ``action``) or a pause."""

    checkpoint_id: str
    kind: str
    prompt: str
    accepted_schema: Any = None
    expires_in: float | None = None
    context: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    step_id: str = ""
    action: dict[str, Any] | None = None


@dataclass(frozen=True)
class Intent:
    """A side effect about to act, as the ledger writes it before the tool runs; ``answer``
    is the approval of this very call the step holds, if any."""

    step_id: str
    tool: str
    target: str
    request: Any
    reversibility: str | None = None
    compensating_action: Any = None
    answer: Answer | None = None


class ApprovalRequired(Exception):
    """The ledger wants a person's approval of this irreversible call first. ``decided``:
    the store already holds a denial (or a request sent back) of this very call."""

    def __init__(
        self,
        detail: str,
        *,
        decided: bool = False,
        denied_by: str | None = None,
        comment: str = "",
        decision: str = "",
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.decided = decided
        self.denied_by = denied_by
        self.comment = comment
        self.decision = decision


class Refused(Exception):
    """The store refused what the step asked for (a bad schema, a bad expiry, an unknown
    tool): the agent's code is wrong, and running it again will not help."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class Backend(Protocol):
    """The store under one attempt. Every method may raise the control's unwinding
    exceptions (``LeaseLost``, ``CancelRequested``) when the store's fence refuses it."""

    lease: AttemptLease
    control: AttemptControl
    # The error type an attempt records when the store refused what the step asked.
    refused_type: str

    # Time ------------------------------------------------------------------------------
    def now(self) -> float:
        """Seconds on this attempt's clock (monotonic): what step deadlines are read on."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less when the control's ``wake`` is set."""
        ...

    # Writes ----------------------------------------------------------------------------
    def checkpoint(self, *, step: str, state: Any) -> tuple[str, bool]:
        """Save a checkpoint; return its id and whether a pause was asked for meanwhile."""
        ...

    def interrupt(self, hold: HoldPoint) -> str:
        """Save the hold point; return the request id."""
        ...

    def complete(self, *, result: Any) -> None: ...

    def fail(self, *, error: dict[str, Any]) -> None: ...

    def release(self, reason: str) -> bool:
        """Give the lease back (cancelled, paused, shutdown); False when someone else owns
        the run already."""
        ...

    def log(self, *, step: str, message: str, level: str, data: dict[str, Any] | None) -> None: ...

    # The ledger ------------------------------------------------------------------------
    def tool(self, name: str) -> Tool:
        """The tool this run calls by ``name`` (``Refused`` when there is none)."""
        ...

    def tool_reversibility(self, name: str) -> str:
        """How reversible the tool called ``name`` is, or "" when none is known."""
        ...

    def asks_before(self, tool: str) -> bool:
        """Whether the agent's policy asks a person before every call of ``tool`` on this
        side of the store (the server's ledger asks itself in process)."""
        ...

    def editable(self, tool: str, request: Any) -> dict[str, Any] | None:
        """What an approver of an irreversible call may edit (``{schema, value}``), or None."""
        ...

    def begin_side_effect(self, intent: Intent) -> Begin:
        """Write the intent (committed before the tool acts) and return the decision.
        Raises ``ApprovalRequired`` or the control's ``SideEffectUnknown``."""
        ...

    def record_outcome(self, operation_id: str, report: Report) -> Effect:
        """Record what a tool did: a fact, never fenced."""
        ...

    def covers(self, answer: Answer, *, tool: str, target: str, change: Any) -> bool:
        """Whether ``answer`` approved exactly this action (``covers``)."""
        ...

    def step_ended(self, step: str) -> None:
        """The step returned and its result is about to be saved."""
        ...


class BackendBase:
    """What most backends share: the wall clock (monotonic), the plain ``covers`` rule."""

    control: AttemptControl

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        self.control.wake.wait(max(0.0, seconds))

    def covers(self, answer: Answer, *, tool: str, target: str, change: Any) -> bool:
        return covers(answer, tool=tool, target=target, change=change)

    def step_ended(self, step: str) -> None:
        return None
