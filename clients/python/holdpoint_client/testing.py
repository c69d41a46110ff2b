"""Test an agent without a server: ``run_agent`` runs its steps in memory, on a fake clock,
with the one runtime every worker runs (``context.py``, ``executor.py``) on an in-memory
store (``MemoryBackend``). No Django, no database::

    from holdpoint_client.testing import FakeTool, run_agent

    def test_it_sends_once_even_if_the_worker_dies_between_act_and_record():
        hook = FakeTool("webhook", reversibility="irreversible")
        run = run_agent(agent, {"customer": "acme"}, approvals=["approve"],
                        tools={"webhook": hook}, crash_after="send.webhook")
        assert run.status == "succeeded" and len(hook.performed) == 1

The same agent runs in the server's process (``runagents``) and over HTTP
(``holdpoint-worker``) unchanged. Inside the server's checkout ``runtime.testing.run_agent``
is this harness with the server's own rules (its JSON Schema checks, its tools' request
schemas, its approval and retry rules); here they are ``Rules``, lighter: answers and
inputs are not checked against their schemas.

What is the same as on a worker, because it is the same code: the checkpoints, hold
points, what people approved, the ledger's decisions, the safe points (every ``ctx`` call,
``next`` and ``done`` included) and the step deadline, read on the fake clock
(``run.clock``): a tool or a ``ctx.sleep`` that moves the clock past a step's ``timeout``
stops the step at its next safe point (right after the side effect's outcome is recorded),
as on a worker. ``clock=``: a ``FakeClock`` to start from (or to share with tools);
``max_attempts``: how many attempts the harness runs before it says the run does not end.
"""

from __future__ import annotations

import copy
import hashlib
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from holdpoint_client.backend import (
    Answer,
    ApprovalRequired,
    AttemptLease,
    Begin,
    Effect,
    HoldPoint,
    Intent,
    Refused,
    Report,
    covers,
    redact_request,
    to_json,
)
from holdpoint_client.context import Context
from holdpoint_client.control import AttemptControl, LeaseLost, SideEffectUnknown
from holdpoint_client.executor import Outcome, run_attempt
from holdpoint_client.tools import Outcome as ToolOutcome
from holdpoint_client.tools import OutcomeUnknown, Tool, ToolResult
from holdpoint_client.typed import dump
from holdpoint_client.types import Approval, RetryPolicy

__all__ = [
    "Crash",
    "FakeClock",
    "FakeContext",
    "FakeTool",
    "HarnessError",
    "MemoryBackend",
    "Question",
    "Rules",
    "RunResult",
    "SideEffectRecord",
    "run_agent",
]


class Crash(LeaseLost):
    """The worker dies here (``crash_after``). An unwinding ``BaseException``: the agent's
    own ``except Exception`` cannot swallow it, as it could not swallow a SIGKILL."""


class HarnessError(AssertionError):
    """The test itself is wrong: an answer that does not fit its question's schema, a
    ``crash_after`` that was never reached, a run that does not end."""


@dataclass
class FakeClock:
    """Seconds since the run started. Backoffs and ``ctx.sleep`` advance it at once; a
    tool may ``advance`` it (work that takes time)."""

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
    act and the record leaves the outcome unknown. ``takes``: seconds each ``execute``
    moves the run's fake clock on (a slow tool).
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
        takes: float = 0.0,
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
        self.takes = takes
        self.clock: FakeClock | None = None  # set by run_agent
        if not compensable:
            self.compensate = None  # type: ignore[assignment]

    @classmethod
    def like(cls, tool: Any) -> FakeTool:
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
        if self.clock is not None and self.takes:
            self.clock.advance(self.takes)
        if self.fail:
            raise self.fail.pop(0)
        if idempotency_key not in self.performed:
            self.performed[idempotency_key] = ToolResult(
                external_reference=self._reference(len(self.performed) + 1, idempotency_key),
                result=self._result(request),
            )
        return self.performed[idempotency_key]

    def lookup(self, idempotency_key: str) -> ToolOutcome | None:
        self.lookups.append(idempotency_key)
        if not self.can_look_up:
            raise OutcomeUnknown(f"{self.name} cannot be asked what became of a key.")
        done = self.performed.get(idempotency_key)
        if done is None:
            return None
        return ToolOutcome(
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


def approval_value(given: Any) -> dict[str, Any]:
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


def as_json(value: Any) -> Any:
    """An answer or input given as a typed value (a model, a dataclass) as the JSON a
    person sends."""
    return to_json(dump(value), "answer")


# The ledger's decision when a key finds a record (``ledger/services/intents.py``).
DECISIONS = {
    "pending": "look_up",
    "confirmed": "reuse",
    "compensation_failed": "reuse",
    "unknown": "refuse",
    "failed": "act",
    "compensated": "act",
}


def _normalise(message: str) -> str:
    return re.sub(r"\d+", "N", message.strip().lower())[:500]


class Rules:
    """The store's rules the harness applies, without a server. ``runtime.testing`` gives
    the server's own (``ServerRules``): JSON Schema checks of inputs and answers, each
    tool's request schema, the approval answer's rules, the failure classes."""

    max_lease_losses = 3

    def check_input(self, agent: Any, value: Any) -> None:
        return None

    def check_answer(self, question: Question, value: Any) -> Any:
        return value

    def check_approval(self, question: Question, value: dict[str, Any]) -> dict[str, Any]:
        return value

    def tool_like(self, agent: Any, name: str) -> Any:
        tools = getattr(agent, "tools", {})
        if isinstance(tools, dict) and name in tools:
            return FakeTool.like(tools[name])
        raise Refused("unknown_tool", f"The agent has no tool named {name!r}.")

    def request_errors(self, tool: Any, request: Any) -> list[dict[str, str]]:
        return []

    def classify(self, error_class: str | None, error_type: str, policy: Any) -> str:
        if error_class:
            return error_class
        return "deterministic" if error_type in policy.non_retryable else "transient"

    def fingerprint(self, *, error_type: str, message: str, step: str) -> str:
        raw = f"{error_type}\x00{_normalise(message)}\x00{step}"
        return hashlib.sha256(raw.encode()).hexdigest()[:16]

    def policy_for(self, agent: Any, step: str) -> Any:
        options = getattr(agent, "step_options", {}).get(step)
        return (options.retry if options is not None else None) or agent.retry

    def backoff(self, policy: RetryPolicy, failures: int, rng: random.Random) -> float:
        return policy.backoff_seconds(failures, rng)

    def idempotency_key(self, *, step_id: str, tool: str) -> str:
        digest = hashlib.sha256(f"{step_id}\x00{tool}".encode()).hexdigest()[:24]
        return f"run_test.{digest}"


class MemoryBackend:
    """The in-memory store under one attempt of ``run_agent`` (or a lone ``FakeContext``):
    its writes go to the harness's run, its time is the fake clock."""

    refused_type = "HoldpointError"

    def __init__(self, run: _Run | None, lease: AttemptLease, control: AttemptControl) -> None:
        self.run = run
        self.lease = lease
        self.control = control
        self.clock = run.clock if run is not None else FakeClock()
        self.logs: list[dict[str, Any]] = []
        self.attempt_cost = Decimal(0)

    def _run(self) -> _Run:
        if self.run is None:
            raise HarnessError("This ctx call needs run_agent (or a FakeContext from it).")
        return self.run

    # Time ------------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock.now

    def sleep(self, seconds: float) -> None:
        self.clock.sleep(seconds)

    # Writes ----------------------------------------------------------------------------
    def checkpoint(self, *, step: str, state: Any) -> tuple[str, bool]:
        run = self._run()
        run.checkpoints.append((step, state))
        return f"cp_{len(run.checkpoints)}", False

    def interrupt(self, hold: HoldPoint) -> str:
        step_id = hold.step_id
        step = step_id.split(".", 1)[0] if step_id else ""
        question = Question(
            key=step_id,
            kind=hold.kind,
            step=step,
            prompt=hold.prompt,
            schema=hold.accepted_schema,
            expires_in=hold.expires_in,
            context=dict(hold.context or {}),
            action=hold.action,
        )
        if self.run is None:
            raise HarnessError(f"Step {step!r} asked {step_id!r} and no answer was given.")
        self.run.questions.append(question)
        return f"req_{len(self.run.questions)}"

    def complete(self, *, result: Any) -> None:
        self._run().result = result

    def fail(self, *, error: dict[str, Any]) -> None:
        self._run().error = error

    def release(self, reason: str) -> bool:
        return True

    def log(self, *, step: str, message: str, level: str, data: dict[str, Any] | None) -> None:
        entry = {"step": step, "message": message, "level": level, **(data or {})}
        self.logs.append(entry)
        if self.run is not None:
            self.run.logs.append(entry)

    # The ledger ------------------------------------------------------------------------
    def tool(self, name: str) -> Tool:
        return self._run().tool(name)

    def tool_reversibility(self, name: str) -> str:
        try:
            return str(self.tool(name).reversibility)
        except (Refused, HarnessError):
            return ""

    def asks_before(self, tool: str) -> bool:
        # The agent's ``ask_before``, as on every backend; the in-memory ledger asks itself
        # for an irreversible call (``begin_side_effect``).
        asks = getattr(self.run.agent if self.run is not None else None, "asks_before", None)
        return bool(asks(tool)) if callable(asks) else False

    def editable(self, tool: str, request: Any) -> dict[str, Any] | None:
        schema = getattr(self.tool(tool), "edit_schema", None)
        return (
            {"schema": schema, "value": redact_request(request)}
            if isinstance(schema, dict)
            else None
        )

    def covers(self, answer: Answer, *, tool: str, target: str, change: Any) -> bool:
        # An answer a test gave a lone FakeContext by key names no action: it covers any.
        return not answer.action or covers(answer, tool=tool, target=target, change=change)

    def begin_side_effect(self, intent: Intent) -> Begin:
        step_id, tool, target, request = intent.step_id, intent.tool, intent.target, intent.request
        reversibility, answer = intent.reversibility, intent.answer
        compensating_action = intent.compensating_action
        run = self._run()
        the_tool = run.tool(tool)
        if not isinstance(request, dict):
            raise Refused("invalid_input", "request must be a JSON object.")
        errors = run.rules.request_errors(the_tool, request)
        if errors:
            first = errors[0]
            raise Refused(
                "invalid_input",
                f"{tool}: the request does not match the tool's request schema "
                f"(docs/tools.md): {first['pointer']}: {first['message']}",
            )
        effective = reversibility or the_tool.reversibility
        if (
            reversibility is None
            and compensating_action is not None
            and effective == "irreversible"
        ):
            effective = "compensable"
        effect = run.effects.get(step_id)
        decision = "act" if effect is None else DECISIONS[effect.status]
        if decision == "refuse":
            raise SideEffectUnknown(
                f"Whether {tool} on {target} happened is unknown.", operation_id=f"op_{step_id}"
            )
        if decision == "reuse":
            assert effect is not None
            effect.decisions.append("reuse")
            return Begin(
                decision="reuse",
                operation_id=f"op_{step_id}",
                idempotency_key=effect.idempotency_key,
                external_reference=effect.external_reference,
                result=copy.deepcopy(effect.result),
                request=request,
            )
        changed = effect is not None and (effect.request, effect.target) != (request, target)
        if (
            effective == "irreversible"
            and step_id not in self.lease.approvals
            and (decision == "act" or changed)
        ):
            if answer is None or not isinstance(answer.value, dict):
                raise ApprovalRequired(
                    f"{tool} on {target} cannot be undone: a person approves it first."
                )
            if answer.value.get("decision") != "approve":
                raise ApprovalRequired("Not approved.", decided=True, denied_by=answer.answered_by)
        if effect is None:
            effect = SideEffectRecord(
                key=step_id,
                tool=tool,
                target=target,
                request=request,
                idempotency_key=run.rules.idempotency_key(step_id=step_id, tool=tool),
                reversibility=effective,
                compensate=compensating_action,
            )
            run.effects[step_id] = effect
        else:
            effect.request, effect.target = request, target
            effect.status = "pending" if decision == "act" else effect.status
        effect.decisions.append(decision)
        return Begin(
            decision=decision,
            operation_id=f"op_{step_id}",
            idempotency_key=effect.idempotency_key,
            request=request,
        )

    def record_outcome(self, operation_id: str, report: Report) -> Effect:
        run = self._run()
        key = operation_id.removeprefix("op_")
        effect = run.effects[key]
        if report.status == "confirmed" and key in run.crash_points:
            run.crash_points.discard(key)
            raise Crash(f"crash after {key} acted, before its outcome was recorded")
        effect.status = report.status
        effect.error = report.error
        # The ledger keeps the first confirmed reference.
        effect.external_reference = effect.external_reference or report.external_reference or ""
        if report.result is not None:
            effect.result = to_json(report.result, "tool result")
        return Effect(
            operation_id=operation_id,
            status=report.status,
            external_reference=effect.external_reference,
            result=copy.deepcopy(effect.result),
            error=report.error,
        )

    def step_ended(self, step: str) -> None:
        run = self.run
        if run is not None and step in run.crash_points:
            # The step returned; the worker dies before the checkpoint is saved.
            run.crash_points.discard(step)
            raise Crash(f"crash after step {step} returned, before its checkpoint was saved")


class FakeContext(Context):
    """A ``ctx`` on an in-memory store of its own, to test one step alone::

        ctx = FakeContext(input={"customer": "acme"}, answers={"plan.ask": {"tone": "firm"}})
        assert plan(ctx, {}) == Next("send", {...})

    ``answers`` maps a hold-point key to its answer; a hold point without one raises
    ``HarnessError``. ``ctx.logs`` lists what the step logged."""

    def __init__(
        self,
        *,
        input: Any = None,
        step: str = "step",
        answers: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        clock: FakeClock | None = None,
    ) -> None:
        lease = AttemptLease(
            run_id="run_test",
            attempt_id="att_test_1",
            agent="",
            number=1,
            reason="initial",
            input=input,
        )
        self.backend = MemoryBackend(None, lease, AttemptControl("att_test_1"))
        if clock is not None:
            self.backend.clock = clock
        given = {
            key: Answer(
                request_id=f"req_{key}",
                kind="auth_required"
                if key.split(".", 1)[-1].startswith("approve")
                else "input_required",
                step_id=key,
                value=approval_value(value)
                if key.split(".", 1)[-1].startswith("approve")
                else value,
                answered_by="tester",
                context={},
            )
            for key, value in (answers or {}).items()
        }
        super().__init__(
            backend=self.backend,
            step=step,
            checkpoint_id="cp_1",
            answers=given,
            resumed=False,
            timeout=timeout,
        )

    @property
    def logs(self) -> list[dict[str, Any]]:
        return self.backend.logs


class _Run:
    """One run of ``run_agent``: its checkpoints, answers, ledger and attempts."""

    def __init__(
        self,
        agent: Any,
        input: Any,
        *,
        answers: Iterable[Any],
        approvals: Iterable[Any],
        preapproved: Iterable[str],
        tools: Mapping[str, Any],
        crash_after: Iterable[str],
        clock: FakeClock,
        seed: int,
        rules: Rules,
    ) -> None:
        self.agent = agent
        self.input = input
        self.answers = list(answers)
        self.approvals = list(approvals)
        self.preapproved = tuple(preapproved)
        self.tools: dict[str, Any] = dict(tools)
        for tool in self.tools.values():
            if isinstance(tool, FakeTool) and tool.clock is None:
                tool.clock = clock
        self.crash_points = set(crash_after)
        self.clock = clock
        self.rules = rules
        self.rng = random.Random(seed)
        self.checkpoints: list[tuple[str, Any]] = []
        # The answers given on each checkpoint (by index), by hold-point key.
        self.answered: dict[int, dict[str, Answer]] = {}
        self.questions: list[Question] = []
        self.effects: dict[str, SideEffectRecord] = {}
        self.attempts: list[Attempt] = []
        self.logs: list[dict[str, Any]] = []
        self.cost = Decimal(0)
        self.result: Any = None
        self.error: dict[str, Any] | None = None
        # The answer the next attempt resumes with (the lease's ``resume_request``).
        self.resume_request: dict[str, Any] | None = None

    def tool(self, name: str) -> Any:
        if name not in self.tools:
            fake = self.rules.tool_like(self.agent, name)
            if isinstance(fake, FakeTool):
                fake.clock = self.clock
            self.tools[name] = fake
        return self.tools[name]

    # Attempts ---------------------------------------------------------------------------

    def run(self, max_attempts: int) -> RunResult:
        if self.agent.start is None:
            raise HarnessError(f"Agent {self.agent.name!r} has no steps.")
        reason = "initial"
        failures: list[tuple[str, str]] = []  # (step, fingerprint) of the failures in a row
        lease_losses = 0
        while len(self.attempts) < max_attempts:
            attempt = Attempt(number=len(self.attempts) + 1, reason=reason)
            self.attempts.append(attempt)
            outcome = self._attempt(attempt)
            if outcome == Outcome.SUCCEEDED:
                attempt.status = "succeeded"
                return RunResult(status="succeeded", result=self.result, **self._parts())
            if outcome == Outcome.ABANDONED:
                attempt.status = "lost"
                lease_losses += 1
                policy = self.agent.retry
                max_losses = (
                    getattr(policy, "max_lease_losses", None) or self.rules.max_lease_losses
                )
                if lease_losses >= max_losses:
                    return self._failed(
                        "lease_lost", "LeaseLost", f"The worker died {lease_losses} times."
                    )
                reason = "lease_expired"
                continue
            lease_losses = 0
            if outcome == Outcome.INTERRUPTED:
                attempt.status = "interrupted"
                failures.clear()  # progress ends a run of failures
                ended = self._answer(len(self.checkpoints) - 1)
                if ended is not None:
                    return ended
                reason = "resume"
                continue
            attempt.status = "failed"
            error = dict(self.error or {})
            attempt.error = error
            step = str(error.get("step", ""))
            # A step's own policy (@agent.step(retry=…)) judges its failures.
            policy = self.rules.policy_for(self.agent, step)
            failure_class = self.rules.classify(error.get("class"), error["type"], policy)
            error["class"] = failure_class
            if failure_class != "transient":
                return self._failed(failure_class, error["type"], error["message"])
            failures.append(
                (
                    step,
                    self.rules.fingerprint(
                        error_type=error["type"], message=error["message"], step=step
                    ),
                )
            )
            own = getattr(self.agent, "step_options", {}).get(step)
            if own is not None and own.retry is not None:
                # A step with its own policy counts its own failures only.
                counted = [f for f in failures if f[0] == step]
            else:
                counted = failures
            same = 0
            for _, print_ in reversed(counted):
                if print_ != counted[-1][1]:
                    break
                same += 1
            if same >= policy.repeated_error_threshold:
                return self._failed(
                    "repeated_error",
                    error["type"],
                    f"The same error {same} times in a row: {error['type']}: {error['message']}",
                )
            if len(counted) >= policy.max_attempts:
                return self._failed(
                    "transient",
                    error["type"],
                    f"Retry budget spent ({len(counted)} of {policy.max_attempts} attempts "
                    f"failed): {error['message']}",
                )
            budget = policy.cost_budget
            if budget is not None and self.cost >= Decimal(str(budget)):
                return self._failed("transient", error["type"], "Cost budget spent.")
            self.clock.back_off(self.rules.backoff(policy, len(counted), self.rng))
            reason = "auto_retry"
        raise HarnessError(f"The run did not end in {max_attempts} attempts.")

    def _attempt(self, attempt: Attempt) -> Outcome:
        """Run the one executor from the latest checkpoint until the attempt ends."""
        index = len(self.checkpoints) - 1
        resume = None
        if index >= 0:
            step, state = self.checkpoints[index]
            resume = {
                "step": step,
                "state": copy.deepcopy(state),
                "checkpoint_id": f"cp_{index + 1}",
            }
        lease = AttemptLease(
            run_id="run_test",
            attempt_id=f"att_test_{attempt.number}",
            agent=self.agent.name,
            number=attempt.number,
            reason=attempt.reason,
            input=copy.deepcopy(self.input),
            approvals=self.preapproved,
            resume_from=resume,
            resume_request=self.resume_request if attempt.reason == "resume" else None,
            run_cost=self.cost,
            answers=dict(self.answered.get(index, {})),
        )
        control = AttemptControl(lease.attempt_id)
        backend = MemoryBackend(self, lease, control)
        self.error = None
        outcome = run_attempt(_Traced(self.agent, self, attempt), backend)
        self.cost += control.cost
        return outcome

    def _answer(self, index: int) -> RunResult | None:
        """Give the next answer to the question the attempt stopped at, or stop there."""
        question = self.questions[-1]
        queue = self.approvals if question.kind == "auth_required" else self.answers
        if not queue:
            return RunResult(status=question.kind, **self._parts())
        value = queue.pop(0)
        if question.kind == "auth_required":
            value = self.rules.check_approval(question, approval_value(value))
        else:
            if question.key.split(".", 1)[-1].startswith("choose") and not isinstance(value, dict):
                value = {"choice": value}
            value = self.rules.check_answer(question, as_json(value))
        question.answer, question.answered = value, True
        request_id = f"req_{len(self.questions)}"
        self.answered.setdefault(index, {})[question.key] = Answer(
            request_id=request_id,
            kind=question.kind,
            step_id=question.key,
            value=value,
            answered_by="tester",
            context=question.context,
            action=dict(question.action or {}),
        )
        self.resume_request = {
            "request_id": request_id,
            "kind": question.kind,
            "step_id": question.key,
            "answer": value,
            "answered_by": "tester",
            "action": question.action,
        }
        return None

    def _failed(self, failure_class: str, error_type: str, message: str) -> RunResult:
        step = self.attempts[-1].step if self.attempts else ""
        error = {"class": failure_class, "type": error_type, "message": message, "step": step}
        return RunResult(status="failed", error=error, **self._parts())

    def _parts(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "checkpoints": self.checkpoints,
            "questions": self.questions,
            "side_effects": self.effects,
            "tools": self.tools,
            "logs": self.logs,
            "cost": self.cost,
            "clock": self.clock,
        }


class _Traced:
    """The agent as the executor sees it in the harness: each step run is logged (the run's
    ``steps_run``) and remembered on the attempt."""

    def __init__(self, agent: Any, run: _Run, attempt: Attempt) -> None:
        self._agent = agent
        self.name = agent.name
        self.start = agent.start
        self.retry = agent.retry
        self.input_type = getattr(agent, "input_type", None)
        self.step_options = getattr(agent, "step_options", {})
        self.steps = {
            name: self._traced(name, func, run, attempt) for name, func in agent.steps.items()
        }

    @staticmethod
    def _traced(name: str, func: Any, run: _Run, attempt: Attempt) -> Any:
        import inspect

        def log() -> None:
            attempt.step = name
            run.logs.append(
                {
                    "step": name,
                    "message": f"step {name} (attempt {attempt.number})",
                    "level": "debug",
                    "event": "step",
                    "attempt": attempt.number,
                }
            )

        if inspect.iscoroutinefunction(func):

            async def traced_async(ctx: Any, state: Any) -> Any:
                log()
                return await func(ctx, state)

            return traced_async

        def traced(ctx: Any, state: Any) -> Any:
            log()
            return func(ctx, state)

        return traced


def run_agent(
    agent: Any,
    input: Any = None,
    *,
    answers: Iterable[Any] = (),
    approvals: Iterable[Any] = (),
    preapproved: Iterable[str] = (),
    tools: Mapping[str, Any] | None = None,
    crash_after: str | Iterable[str] = (),
    clock: FakeClock | None = None,
    seed: int = 0,
    max_attempts: int = 100,
    rules: Rules | None = None,
) -> RunResult:
    """Run ``agent`` on ``input`` in memory until it succeeds, fails or waits for a person.

    ``answers``: the answers to its ``ask`` questions, in the order they are asked.
    ``approvals``: the decisions on its approvals (``ctx.approve`` and an irreversible
    tool's), in order: ``True``/``"approve"``, ``False``/``"deny"`` or ``{"decision":
    …, "comment": …}``. ``preapproved``: hold-point keys approved when the run was started
    (``approvals=[…]`` of ``run_start``). ``tools``: fakes by tool name (others are a
    ``FakeTool`` like the agent's tool). ``crash_after``: a step name or a side effect's
    key (or several), where the worker dies once. ``clock``: the ``FakeClock`` the run's
    time is read on (backoffs, ``ctx.sleep``, step deadlines); a fresh one by default.
    ``seed``: the backoff jitter's. ``max_attempts``: the attempts run before the harness
    gives up with ``HarnessError`` (a run that never ends is a test's mistake).
    """
    rules = rules or Rules()
    input = as_json(input)
    rules.check_input(agent, input)
    points = [crash_after] if isinstance(crash_after, str) else list(crash_after)
    run = _Run(
        agent,
        to_json(input if input is not None else {}, "input"),
        answers=answers,
        approvals=approvals,
        preapproved=preapproved,
        tools=tools or {},
        crash_after=points,
        clock=clock or FakeClock(),
        seed=seed,
        rules=rules,
    )
    result = run.run(max_attempts)
    if run.crash_points:
        raise HarnessError(
            f"crash_after {sorted(run.crash_points)} was never reached: no step of that name "
            "returned and no side effect of that key acted."
        )
    return result
