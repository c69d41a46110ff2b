"""The fakes of the harness: the clock, tools, and what a run records (``runtime.testing``)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ledger.tools import (
    Outcome,
    OutcomeUnknown,
    Tool,
    ToolResult,
)
from runtime.context import to_json
from runtime.typed import dump
from runtime.types import Approval


class Crash(BaseException):
    """The worker dies here (``crash_after``). A ``BaseException``: the agent's own
    ``except Exception`` cannot swallow it, as it could not swallow a SIGKILL."""


class HarnessError(AssertionError):
    """The test itself is wrong: an answer that does not fit its question's schema, a
    ``crash_after`` that was never reached, a run that does not end."""


class _HoldPoint(BaseException):
    def __init__(self, question: Question) -> None:
        super().__init__(question.key)
        self.question = question


class _Unknown(BaseException):
    """An outcome nobody can tell: the attempt fails ``side_effect_unknown`` whatever the
    step's ``except`` clauses say (as on a worker)."""


@dataclass
class FakeClock:
    """Seconds since the run started. Backoffs and ``ctx.sleep`` advance it at once."""

    now: float = 0.0
    backoffs: list[float] = field(default_factory=list)  # the waits before automatic retries
    sleeps: list[float] = field(default_factory=list)  # ctx.sleep

    def advance(self, seconds: float) -> None:
        self.now += max(0.0, float(seconds))

    def back_off(self, seconds: float) -> None:
        self.backoffs.append(seconds)
        self.advance(seconds)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)


class FakeTool:
    """A tool that does nothing but remember: ``calls`` (every execute, with its key),
    ``performed`` (what was done, by idempotency key; a repeat of a key is not a second
    act). Its look-up finds what it did, with the reference it gave.

    ``fail``: exceptions raised by the next calls of ``execute``, in order
    (``ActionFailed("refused")``: it did not happen; ``OutcomeUnknown("timeout")``: nobody
    can tell). ``reference``: how the reference is made from the call's number and key.
    ``can_look_up=False``: its look-up never tells (as e-mail's), so a crash between its
    act and the record leaves the outcome unknown.
    """

    def __init__(
        self,
        name: str,
        *,
        reversibility: str = "reversible",
        request_schema: dict[str, Any] | None = None,
        result: Callable[[Any], Any] | None = None,
        reference: Callable[[int, str], str] | None = None,
        fail: Iterable[Exception] = (),
        compensable: bool = True,
        can_look_up: bool = True,
    ) -> None:
        self.name = name
        self.reversibility = reversibility
        self.request_schema = request_schema
        self._result = result or (lambda request: {"ok": True})
        self._reference = reference or (lambda n, key: f"{name}-{n}")
        self.fail = list(fail)
        self.calls: list[tuple[Any, str]] = []
        self.performed: dict[str, ToolResult] = {}
        self.lookups: list[str] = []
        self.compensated: list[str] = []
        self.can_look_up = can_look_up
        if not compensable:
            self.compensate = None  # type: ignore[assignment]

    @classmethod
    def like(cls, tool: Tool) -> FakeTool:
        """A fake with the real tool's name, reversibility and request schema."""
        return cls(
            tool.name,
            reversibility=tool.reversibility,
            request_schema=getattr(tool, "request_schema", None),
            compensable=callable(getattr(tool, "compensate", None)),
            can_look_up=bool(getattr(tool, "can_look_up", True)),
        )

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        self.calls.append((copy.deepcopy(request), idempotency_key))
        if self.fail:
            raise self.fail.pop(0)
        if idempotency_key not in self.performed:
            self.performed[idempotency_key] = ToolResult(
                external_reference=self._reference(len(self.performed) + 1, idempotency_key),
                result=self._result(request),
            )
        return self.performed[idempotency_key]

    def lookup(self, idempotency_key: str) -> Outcome | None:
        self.lookups.append(idempotency_key)
        if not self.can_look_up:
            raise OutcomeUnknown(f"{self.name} cannot be asked what became of a key.")
        done = self.performed.get(idempotency_key)
        if done is None:
            return None
        return Outcome(
            status="confirmed", external_reference=done.external_reference, result=done.result
        )

    def compensate(self, side_effect: Any) -> ToolResult:
        self.compensated.append(side_effect.idempotency_key)
        return ToolResult(external_reference=f"undo-{side_effect.idempotency_key}")


@dataclass
class Question:
    """A hold point the run reached: what a person would see, and the answer given."""

    key: str
    kind: str  # input_required | auth_required
    step: str
    prompt: str
    schema: Any = None
    expires_in: float | None = None
    context: dict[str, Any] = field(default_factory=dict)
    action: dict[str, Any] | None = None
    answer: Any = None
    answered: bool = False


@dataclass
class SideEffectRecord:
    """The in-memory ledger's record of one side effect (one key)."""

    key: str
    tool: str
    target: str
    request: Any
    idempotency_key: str
    reversibility: str
    status: str = "pending"
    external_reference: str = ""
    result: Any = None
    error: Any = None
    compensate: Any = None
    decisions: list[str] = field(default_factory=list)
    action_hash: str = ""


@dataclass
class Attempt:
    number: int
    reason: str
    status: str = "running"  # succeeded | failed | interrupted | lost
    step: str = ""
    error: dict[str, Any] | None = None


@dataclass
class RunResult:
    """How the run ended, and everything it did on the way."""

    status: str  # succeeded | failed | input_required | auth_required
    result: Any = None
    error: dict[str, Any] | None = None  # {class, type, message, step} of the failure
    attempts: list[Attempt] = field(default_factory=list)
    checkpoints: list[tuple[str, Any]] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    side_effects: dict[str, SideEffectRecord] = field(default_factory=dict)
    tools: dict[str, Any] = field(default_factory=dict)
    logs: list[dict[str, Any]] = field(default_factory=list)
    cost: Decimal = Decimal(0)
    clock: FakeClock = field(default_factory=FakeClock)

    @property
    def pending(self) -> Question | None:
        """The question the run is waiting on (status ``input_required`` / ``auth_required``)."""
        if self.questions and not self.questions[-1].answered:
            return self.questions[-1]
        return None

    @property
    def failure_class(self) -> str | None:
        return (self.error or {}).get("class")

    @property
    def steps_run(self) -> list[str]:
        """Every step run, in order, one entry per run of a step (re-runs included)."""
        return [entry["step"] for entry in self.logs if entry.get("event") == "step"]


@dataclass
class _AnswerGiven:
    kind: str
    value: Any
    context: dict[str, Any]
    action_hash: str = ""


def _approval_value(given: Any) -> dict[str, Any]:
    """``True`` / ``"approve"`` / ``{"decision": …, "comment": …, "edited": …}`` /
    ``Approval(…)``; the decision is approve, deny or respond (send back with a comment)."""
    if isinstance(given, Approval):
        decision = given.decision or ("approve" if given.approved else "deny")
        found = {"decision": decision, "comment": given.comment, "edited": given.edited}
        return {k: v for k, v in found.items() if v not in (None, "")}
    if given is False or given == "deny":
        return {"decision": "deny", "comment": "Denied by the test."}
    if given is True or given == "approve":
        return {"decision": "approve"}
    if isinstance(given, dict) and given.get("decision") in ("approve", "deny", "respond"):
        return {k: v for k, v in given.items() if v is not None}
    raise HarnessError(
        "An approval is True/False, 'approve'/'deny' or {'decision': approve | deny | "
        f"respond, 'comment': …, 'edited': …}}, not {given!r}."
    )


def _as_json(value: Any) -> Any:
    """An answer or input given as a typed value (a model, a dataclass) as the JSON a
    person sends."""
    return to_json(dump(value), "answer")
