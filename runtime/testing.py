"""Test an agent without a server: ``run_agent`` runs its steps in memory with the rules.

::

    from runtime.testing import FakeTool, run_agent

    def test_it_sends_once_even_if_the_worker_dies_between_act_and_record():
        hook = FakeTool("webhook", reversibility="irreversible")
        run = run_agent(
            agent,
            {"customer": "acme"},
            answers=[{"tone": "firm"}],
            approvals=["approve"],
            tools={"webhook": hook},
            crash_after="send.webhook",
        )
        assert run.status == "succeeded"
        assert len(hook.performed) == 1

What is the same as on a worker (``runtime/executor.py``, ``runtime/context.py``,
``runs/services/failures.py``, ``ledger/services/intents.py``):

- a checkpoint before the first step and after every ``ctx.next``; a step is what runs
  again (after an answer, a failure or a crash), from its checkpoint's state, as JSON;
- hold points: ``ask`` / ``approve`` (and the approval an irreversible tool needs) end the
  attempt; the next answer in ``answers`` / ``approvals`` is given and the step runs again
  from its checkpoint, where the same call (same key) returns it. With no answer left the
  run stops there: ``status`` is ``input_required`` or ``auth_required``;
- the ledger's decision table (act, look up, reuse, refuse) by the record's status, with
  the ledger's idempotency keys; a request is checked against the tool's schema;
- failures classified by the agent's ``RetryPolicy`` (transient, deterministic, repeated
  error, the retry budget, the cost budget), backing off on a fake clock (``run.clock``)
  instead of waiting; ``ctx.sleep`` advances the clock too;
- ``crash_after``: the worker dies (SIGKILL) once at that point, and a new attempt goes
  on from the last checkpoint, as after a lease runs out. A step name crashes after the
  step returned and before its checkpoint is saved (so the step runs again); a side
  effect's key (``send.webhook``, ``send.notice``) crashes after the tool acted and before
  the outcome is recorded (so the ledger looks the key up).

What is not here: the database, leases, heartbeats, cancel, pause, people's retries. A
test that needs them drives a real worker (``runtime.executor.execute``).

Tools the test does not give in ``tools`` are replaced by a ``FakeTool`` of the same name,
reversibility and request schema: no test sends a real e-mail or webhook by accident.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings

from ledger.tools import (
    ActionFailed,
    Outcome,
    OutcomeUnknown,
    Tool,
    ToolResult,
    get_tool,
    request_errors,
)
from runs.errors import HoldpointError
from runs.schemas import compile_schema, validation_errors
from runtime.context import (
    approval_options,
    change_is_empty,
    choice_schema,
    fingerprint,
    hold_point_key,
    to_json,
    typed_value,
)
from runtime.control import StepTimeout
from runtime.steps import run_step
from runtime.typed import dump, is_typed, schema_of
from runtime.types import (
    Approval,
    ApprovalDenied,
    Confirmed,
    CostBudgetExceeded,
    Done,
    Next,
    SideEffectFailed,
    StepError,
)

__all__ = [
    "Crash",
    "FakeClock",
    "FakeContext",
    "FakeTool",
    "HarnessError",
    "Question",
    "RunResult",
    "SideEffectRecord",
    "run_agent",
]


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
    """``True`` / ``"approve"`` / ``{"decision": …, "comment": …}`` / ``Approval(…)``."""
    if isinstance(given, Approval):
        return {"decision": "approve" if given.approved else "deny", "comment": given.comment}
    if isinstance(given, bool):
        return {"decision": "approve" if given else "deny"}
    if given in ("approve", "deny"):
        return {"decision": given}
    if isinstance(given, dict) and given.get("decision") in ("approve", "deny"):
        return dict(given)
    raise HarnessError(
        f"An approval is True/False, 'approve'/'deny' or {{'decision': …}}, not {given!r}."
    )


def _as_json(value: Any) -> Any:
    """An answer or input given as a typed value (a model, a dataclass) as the JSON a
    person sends."""
    return to_json(dump(value), "answer")


class FakeContext:
    """The ``ctx`` a step gets from ``run_agent``: the same calls as ``runtime.context.Context``.

    A step may be called with one directly, to test it alone::

        ctx = FakeContext(input={"customer": "acme"}, answers={"plan.ask": {"tone": "firm"}})
        result = plan(ctx, {})
        assert result == Next("send", {...})

    ``answers`` there maps a hold-point key to its answer; a hold point without one raises
    ``HarnessError``.
    """

    def __init__(
        self,
        *,
        input: Any = None,
        step: str = "step",
        answers: Mapping[str, Any] | None = None,
        run: _Run | None = None,
        checkpoint: int = 0,
        resumed: bool = False,
        input_type: type | None = None,
        timeout: float | None = None,
    ) -> None:
        self._run = run
        self._timeout = timeout
        self._started = run.clock.now if run is not None else 0.0
        self._input = input
        self._input_type = input_type
        given = answers or {}
        self._answers: dict[str, _AnswerGiven] = {
            key: value
            if isinstance(value, _AnswerGiven)
            else _AnswerGiven(
                kind="auth_required" if key.split(".", 1)[-1].startswith("approve") else "",
                value=value,
                context={},
            )
            for key, value in given.items()
        }
        self._counts: Counter[str] = Counter()
        self._observed: dict[str, Any] = {}
        self._changed: set[str] = set()
        self.step = step
        self.checkpoint_id = f"cp_{checkpoint + 1}"
        self.resumed = resumed
        self.logs: list[dict[str, Any]] = []

    # What the step is working on ------------------------------------------------------

    @property
    def run_id(self) -> str:
        return "run_test"

    @property
    def attempt_id(self) -> str:
        return f"att_test_{self.attempt_number}"

    @property
    def attempt_number(self) -> int:
        return self._run.attempts[-1].number if self._run else 1

    @property
    def attempt_reason(self) -> str:
        return self._run.attempts[-1].reason if self._run else "initial"

    @property
    def input(self) -> Any:
        if self._input_type is not None and not isinstance(self._input, self._input_type):
            # Built once per step run, as on a worker.
            self._input = typed_value(self._input_type, self._input, "input")
        return self._input

    # Results and safe points ----------------------------------------------------------

    def next(self, step: str, state: Any = None) -> Next:
        return Next(step=step, state={} if state is None else state)

    def done(self, result: Any = None) -> Done:
        return Done(result=result)

    def check(self) -> None:
        """A safe point. Nothing cancels a run in the harness; a step past its ``timeout``
        (on the fake clock: ``ctx.sleep`` advances it) stops here."""
        if (
            self._timeout is not None
            and self._run is not None
            and self._run.clock.now - self._started >= self._timeout
        ):
            raise StepTimeout(
                f"Step {self.step!r} ran past its timeout of {self._timeout:g} s and was "
                "stopped at a safe point."
            )

    def sleep(self, seconds: float) -> None:
        self.check()
        if self._run is not None:
            wait = max(0.0, seconds)
            if self._timeout is not None:
                wait = min(wait, self._started + self._timeout - self._run.clock.now)
            self._run.clock.sleep(wait)
        self.check()

    # Hold points ----------------------------------------------------------------------

    def _key(self, kind: str, key: str | None) -> str:
        if key is not None:
            return hold_point_key(f"{self.step}.{key}")
        self._counts[kind] += 1
        n = self._counts[kind]
        return hold_point_key(f"{self.step}.{kind}" if n == 1 else f"{self.step}.{kind}#{n}")

    def _hold(self, question: Question) -> None:
        shown = dict(to_json(question.context or {}, "hold point context"))
        if self._observed:
            shown.setdefault("observed", self._observed)
        question.context = shown
        if self._run is None:
            raise HarnessError(
                f"Step {self.step!r} asked {question.key!r} and no answer was given."
            )
        raise _HoldPoint(question)

    def ask(
        self,
        prompt: str,
        schema: Any,
        expires_in: float | None = None,
        *,
        context: dict[str, Any] | None = None,
        reason: str = "",
        key: str | None = None,
    ) -> Any:
        self.check()
        step_id = self._key("ask", key)
        answer_type = schema if is_typed(schema) else None
        answer = self._answers.get(step_id)
        if answer is not None and answer.kind != "auth_required":
            if answer_type is not None and isinstance(answer.value, answer_type):
                return answer.value
            return typed_value(answer_type, answer.value, f"answer to {step_id}")
        self._hold(
            Question(
                key=step_id,
                kind="input_required",
                step=self.step,
                prompt=prompt,
                schema=compile_schema(schema_of(schema) if answer_type is not None else schema),
                expires_in=expires_in,
                context=context or {},
            )
        )
        raise AssertionError("unreachable")  # pragma: no cover

    def choose(
        self,
        prompt: str,
        options: list[str] | dict[str, str],
        expires_in: float | None = None,
        *,
        context: dict[str, Any] | None = None,
        reason: str = "",
        key: str | None = None,
    ) -> str:
        """Pick one of ``options``. In ``answers``, give the value picked (or
        ``{"choice": value}``)."""
        self.check()
        schema = choice_schema(options)
        step_id = self._key("choose", key)
        answer = self._answers.get(step_id)
        if answer is not None and answer.kind != "auth_required":
            value = answer.value
            return str(value.get("choice", "") if isinstance(value, dict) else value)
        self._hold(
            Question(
                key=step_id,
                kind="input_required",
                step=self.step,
                prompt=prompt,
                schema=schema,
                expires_in=expires_in,
                context=context or {},
            )
        )
        raise AssertionError("unreachable")  # pragma: no cover

    def approve(
        self,
        action: str,
        target: str,
        detail: Any = None,
        expires_in: float | None = None,
        *,
        tool: str | None = None,
        reversibility: str | None = None,
        prompt: str | None = None,
        context: dict[str, Any] | None = None,
        reason: str = "",
        key: str | None = None,
    ) -> Approval:
        from ledger.services import action_hash

        self.check()
        step_id = self._key("approve", key)
        change = to_json(detail, "approval detail")
        wanted = action_hash(tool=tool or action, target=target, request=change)
        answer = self._answers.get(step_id)
        if (
            answer is not None
            and answer.kind == "auth_required"
            and answer.action_hash in ("", wanted)
        ):
            value = _approval_value(answer.value)
            return Approval(
                approved=value["decision"] == "approve",
                comment=str(value.get("comment") or ""),
                answered_by="tester",
                request_id=f"req_{step_id}",
            )
        if self._run is not None and step_id in self._run.preapproved:
            return Approval(approved=True, comment="Approved when the run was started.")
        if change_is_empty(change):
            self.log(
                f"Did not ask for approval of {action} on {target}: "
                "the planned change is empty (nothing would change).",
                event="approval_skipped",
            )
            return Approval(approved=True, unchanged=True)
        self._hold(
            Question(
                key=step_id,
                kind="auth_required",
                step=self.step,
                prompt=prompt or f"Approve {action} on {target}?",
                expires_in=expires_in,
                context=context or {},
                action={
                    "tool": tool or action,
                    "action": action,
                    "target": target,
                    "change": change,
                    "reversibility": reversibility or "",
                    "hash": wanted,
                },
            )
        )
        raise AssertionError("unreachable")  # pragma: no cover

    # Side effects ---------------------------------------------------------------------

    def side_effect(
        self,
        tool: str,
        target: str,
        request: dict[str, Any],
        *,
        compensate: dict[str, Any] | None = None,
        reversibility: str | None = None,
        key: str | None = None,
        approval: dict[str, Any] | None = None,
    ) -> Confirmed:
        if self._run is None:
            raise HarnessError("ctx.side_effect needs run_agent (or a FakeContext from it).")
        self.check()
        step_id = self._key(tool, key)
        return self._run.side_effect(
            self,
            step_id=step_id,
            tool=tool,
            target=target,
            request=to_json(request, "side-effect request"),
            compensate=to_json(compensate, "compensating action"),
            reversibility=reversibility,
            approval=approval_options(approval),
        )

    def _answer_for(self, step_id: str) -> _AnswerGiven | None:
        return self._answers.get(step_id)

    # Observations, cost, log ----------------------------------------------------------

    def observe(self, name: str, read: Any, *args: Any, **kwargs: Any) -> Any:
        self.check()
        value = read(*args, **kwargs)
        as_json = to_json(value, f"observed value {name!r}")
        summary: dict[str, Any] = {"fingerprint": fingerprint(as_json), "value": as_json}
        self._observed[name] = summary
        before = None
        for answer in self._answers.values():
            observed = (answer.context or {}).get("observed") or {}
            if isinstance(observed, dict) and isinstance(observed.get(name), dict):
                before = observed[name]
        if before is not None and before.get("fingerprint") != summary["fingerprint"]:
            self._changed.add(name)
            self.log(
                f"{name} changed while the run was waiting",
                level="warning",
                name=name,
                before=before.get("value"),
                after=as_json,
            )
        return value

    def changed(self, name: str) -> bool:
        return name in self._changed

    def cost(self, amount: float | Decimal | str) -> Decimal:
        self.check()
        try:
            value = Decimal(str(amount))
        except InvalidOperation:
            raise ValueError(f"cost must be a number, not {amount!r}") from None
        if not value.is_finite() or value < 0:
            raise ValueError("cost must be a non-negative number")
        if self._run is None:
            return value
        self._run.cost += value
        self._run.attempt_cost += value
        budget = self._run.agent.retry.cost_budget
        if budget is not None and self._run.cost > Decimal(str(budget)):
            raise CostBudgetExceeded(
                f"The run has cost {self._run.cost}, past its budget of {budget}."
            )
        return self._run.attempt_cost

    def log(self, message: str, level: str = "info", **data: Any) -> None:
        entry = {"step": self.step, "message": str(message), "level": level, **data}
        self.logs.append(entry)
        if self._run is not None:
            self._run.logs.append(entry)


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
    ) -> None:
        self.agent = agent
        self.input = input
        self.answers = list(answers)
        self.approvals = list(approvals)
        self.preapproved = set(preapproved)
        self.tools: dict[str, Any] = dict(tools)
        self.crash_points = set(crash_after)
        self.clock = clock
        self.rng = random.Random(seed)
        self.checkpoints: list[tuple[str, Any]] = []
        self.answered: dict[int, dict[str, _AnswerGiven]] = {}
        self.questions: list[Question] = []
        self.effects: dict[str, SideEffectRecord] = {}
        self.attempts: list[Attempt] = []
        self.logs: list[dict[str, Any]] = []
        self.cost = Decimal(0)
        self.attempt_cost = Decimal(0)

    # The ledger, in memory ------------------------------------------------------------

    def tool(self, name: str) -> Any:
        if name not in self.tools:
            self.tools[name] = FakeTool.like(get_tool(name))
        return self.tools[name]

    def side_effect(
        self,
        ctx: FakeContext,
        *,
        step_id: str,
        tool: str,
        target: str,
        request: Any,
        compensate: Any,
        reversibility: str | None,
        approval: dict[str, Any],
    ) -> Confirmed:
        from ledger.services import action_hash, decision_for, idempotency_key_for

        the_tool = self.tool(tool)
        if not isinstance(request, dict):
            raise HoldpointError("invalid_input", "request must be a JSON object.")
        errors = request_errors(the_tool, request)
        if errors:
            first = errors[0]
            raise HoldpointError(
                "invalid_input",
                f"{tool}: the request does not match the tool's request schema "
                f"(docs/tools.md): {first['pointer']}: {first['message']}",
                errors=errors,
            )
        effective = reversibility or the_tool.reversibility
        if reversibility is None and compensate is not None and effective == "irreversible":
            effective = "compensable"
        wanted = action_hash(tool=tool, target=target, request=request)
        effect = self.effects.get(step_id)
        decision = "act" if effect is None else decision_for(effect.status)
        if decision == "refuse":
            raise _Unknown(f"Whether {tool} on {target} happened is unknown.")
        if decision == "reuse":
            assert effect is not None
            effect.decisions.append("reuse")
            return Confirmed(
                operation_id=f"op_{step_id}",
                external_reference=effect.external_reference,
                result=copy.deepcopy(effect.result),
                decision="reuse",
            )
        if effective == "irreversible" and (
            decision == "act" or (effect is not None and effect.action_hash != wanted)
        ):
            self._approved(ctx, step_id, tool, target, request, wanted, approval)
        if effect is None:
            effect = SideEffectRecord(
                key=step_id,
                tool=tool,
                target=target,
                request=request,
                idempotency_key=idempotency_key_for(
                    run_id="run_test", step_id=step_id, tool=tool, generation=0
                ),
                reversibility=effective,
                compensate=compensate,
                action_hash=wanted,
            )
            self.effects[step_id] = effect
        else:
            effect.request, effect.target, effect.action_hash = request, target, wanted
            effect.status = "pending"
        key = effect.idempotency_key
        if decision == "look_up":
            effect.decisions.append("look_up")
            try:
                found = the_tool.lookup(key)
            except OutcomeUnknown as exc:
                effect.status, effect.error = "unknown", exc.as_error()
                raise _Unknown(f"{tool} on {target}: {exc.message}") from exc
            if found is not None:
                self._record(effect, found.status, found.external_reference, found.result)
                return self._settled(effect, "look_up")
        else:
            effect.decisions.append("act")
        try:
            done = the_tool.execute(request, key)
        except ActionFailed as exc:
            effect.status, effect.error = "failed", exc.as_error()
        except OutcomeUnknown as exc:
            effect.status, effect.error = "unknown", exc.as_error()
        except Exception as exc:  # noqa: BLE001 - as on a worker: nobody can tell what it did
            effect.status = "unknown"
            effect.error = {"type": type(exc).__name__, "message": str(exc)}
        else:
            if step_id in self.crash_points:
                self.crash_points.discard(step_id)
                raise Crash(f"crash after {step_id} acted, before its outcome was recorded")
            self._record(effect, "confirmed", done.external_reference, done.result)
        return self._settled(effect, decision)

    def _approved(
        self,
        ctx: FakeContext,
        step_id: str,
        tool: str,
        target: str,
        request: Any,
        wanted: str,
        asked: dict[str, Any],
    ) -> None:
        if step_id in self.preapproved:
            return
        answer = ctx._answer_for(step_id)
        if answer is not None and answer.kind == "auth_required" and answer.action_hash == wanted:
            value = _approval_value(answer.value)
            if value["decision"] == "approve":
                return
            approval = Approval(
                approved=False, comment=str(value.get("comment") or ""), answered_by="tester"
            )
            raise ApprovalDenied(
                f"{tool} on {target} was denied"
                + (f": {approval.comment}" if approval.comment else "."),
                approval=approval,
            )
        ctx._hold(
            Question(
                key=step_id,
                kind="auth_required",
                step=ctx.step,
                prompt=asked.get("prompt") or f"Approve {tool} on {target}? It cannot be undone.",
                expires_in=asked.get("expires_in"),
                context=asked.get("context") or {},
                action={
                    "tool": tool,
                    "action": tool,
                    "target": target,
                    "change": request,
                    "reversibility": "irreversible",
                    "hash": wanted,
                },
            )
        )

    @staticmethod
    def _record(
        effect: SideEffectRecord, status: str, reference: str, result: Any
    ) -> SideEffectRecord:
        effect.status = status
        # The ledger keeps the first confirmed reference.
        effect.external_reference = effect.external_reference or reference or ""
        effect.result = to_json(result, "tool result")
        return effect

    @staticmethod
    def _settled(effect: SideEffectRecord, decision: str) -> Confirmed:
        if effect.status == "confirmed":
            return Confirmed(
                operation_id=f"op_{effect.key}",
                external_reference=effect.external_reference,
                result=copy.deepcopy(effect.result),
                decision=decision,
            )
        message = (effect.error or {}).get("message") if isinstance(effect.error, dict) else None
        if effect.status == "failed":
            raise SideEffectFailed(
                f"{effect.tool} on {effect.target} failed: {message or 'refused'}",
                operation_id=f"op_{effect.key}",
                error=effect.error,
            )
        raise _Unknown(f"{effect.tool} on {effect.target}: {message or 'the outcome is unknown'}")

    # Attempts ---------------------------------------------------------------------------

    def run(self, max_attempts: int) -> RunResult:
        from runs.services import error_fingerprint
        from runs.services.failures import classify

        policy = self.agent.retry
        if self.agent.start is None:
            raise HarnessError(f"Agent {self.agent.name!r} has no steps.")
        self.checkpoints.append((self.agent.start, {}))
        reason = "initial"
        failures: list[tuple[str, str]] = []  # (step, fingerprint) of the failures in a row
        lease_losses = 0
        max_losses = policy.max_lease_losses or settings.HOLDPOINT_MAX_LEASE_LOSSES
        while len(self.attempts) < max_attempts:
            attempt = Attempt(number=len(self.attempts) + 1, reason=reason)
            self.attempts.append(attempt)
            self.attempt_cost = Decimal(0)
            ended = self._attempt(attempt)
            if isinstance(ended, RunResult):
                return ended
            if attempt.status == "lost":
                lease_losses += 1
                if lease_losses >= max_losses:
                    return self._failed(
                        "lease_lost", "LeaseLost", f"The worker died {lease_losses} times."
                    )
                reason = "lease_expired"
                continue
            lease_losses = 0
            if attempt.status == "interrupted":
                failures.clear()  # progress ends a run of failures
                reason = "resume"
                continue
            error = attempt.error or {}
            # A step's own policy (@agent.step(retry=…)) judges its failures.
            policy = self.agent.spec.policy_for(error["step"])
            failure_class = classify(error.get("class"), error["type"], policy)
            error["class"] = failure_class
            if failure_class != "transient":
                return self._failed(failure_class, error["type"], error["message"])
            failures.append(
                (
                    error["step"],
                    error_fingerprint(
                        error_type=error["type"], message=error["message"], step=error["step"]
                    ),
                )
            )
            if error["step"] in self.agent.spec.step_retry:
                # A step with its own policy counts its own failures only.
                counted = [f for f in failures if f[0] == error["step"]]
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
            if policy.cost_budget is not None and self.cost >= Decimal(str(policy.cost_budget)):
                return self._failed("transient", error["type"], "Cost budget spent.")
            self.clock.back_off(policy.backoff_seconds(len(counted), self.rng))
            reason = "auto_retry"
        raise HarnessError(f"The run did not end in {max_attempts} attempts.")

    def _attempt(self, attempt: Attempt) -> RunResult | None:
        """Run steps from the latest checkpoint until the attempt ends."""
        index = len(self.checkpoints) - 1
        step, state = self.checkpoints[index]
        resumed = attempt.reason != "initial"
        while True:
            attempt.step = step
            if step not in self.agent.steps:
                attempt.status = "failed"
                attempt.error = {
                    "class": "deterministic",
                    "type": "UnknownStep",
                    "message": f"Agent {self.agent.name!r} has no step {step!r}.",
                    "step": step,
                }
                return None
            options = getattr(self.agent, "step_options", {}).get(step)
            ctx = FakeContext(
                input=copy.deepcopy(self.input),
                step=step,
                answers=self.answered.get(index, {}),
                run=self,
                checkpoint=index,
                resumed=resumed,
                input_type=getattr(self.agent, "input_type", None),
                timeout=options.timeout if options is not None else None,
            )
            self.logs.append(
                {
                    "step": step,
                    "message": f"step {step} (attempt {attempt.number})",
                    "level": "debug",
                    "event": "step",
                    "attempt": attempt.number,
                }
            )
            try:
                result = run_step(self.agent.steps[step], ctx, to_json(state, "state"))
            except _HoldPoint as hold:
                return self._hold(attempt, hold.question, index)
            except Crash:
                attempt.status = "lost"
                return None
            except _Unknown as exc:
                attempt.status = "failed"
                return self._failed("side_effect_unknown", "SideEffectUnknown", str(exc))
            except StepTimeout as exc:
                self._fail(attempt, "transient", exc, exc.message)
                return None
            except StepError as exc:
                self._fail(attempt, exc.failure_class, exc)
                return None
            except HoldpointError as exc:
                self._fail(attempt, "deterministic", exc, f"{exc.code}: {exc.detail}")
                return None
            except Exception as exc:  # noqa: BLE001 - the agent's code may raise anything
                self._fail(attempt, None, exc)
                return None
            if step in self.crash_points:
                # The step returned; the worker dies before the checkpoint is saved.
                self.crash_points.discard(step)
                attempt.status = "lost"
                return None
            if isinstance(result, Done):
                attempt.status = "succeeded"
                return RunResult(
                    status="succeeded", result=to_json(result.result, "result"), **self._parts()
                )
            if not isinstance(result, Next):
                attempt.status = "failed"
                attempt.error = {
                    "class": "deterministic",
                    "type": "BadStepResult",
                    "message": f"Step {step!r} returned {type(result).__name__}.",
                    "step": step,
                }
                return None
            if result.step not in self.agent.steps:
                attempt.status = "failed"
                attempt.error = {
                    "class": "deterministic",
                    "type": "UnknownStep",
                    "message": f"Step {step!r} asked for step {result.step!r}, which agent "
                    f"{self.agent.name!r} does not have.",
                    "step": step,
                }
                return None
            state = to_json(result.state, "state")
            self.checkpoints.append((result.step, state))
            index = len(self.checkpoints) - 1
            step, resumed = result.step, False

    def _hold(self, attempt: Attempt, question: Question, index: int) -> RunResult | None:
        self.questions.append(question)
        attempt.status = "interrupted"
        queue = self.approvals if question.kind == "auth_required" else self.answers
        if not queue:
            return RunResult(status=question.kind, **self._parts())
        value = queue.pop(0)
        if question.kind == "auth_required":
            value = _approval_value(value)
        else:
            if question.key.split(".", 1)[-1].startswith("choose") and not isinstance(value, dict):
                value = {"choice": value}
            value = _as_json(value)
            errors = validation_errors(question.schema or {}, value)
            if errors:
                raise HarnessError(
                    f"The answer {value!r} to {question.key!r} does not fit its schema: "
                    + "; ".join(f"{e['pointer']}: {e['message']}" for e in errors)
                )
        question.answer, question.answered = value, True
        self.answered.setdefault(index, {})[question.key] = _AnswerGiven(
            kind=question.kind,
            value=value,
            context=question.context,
            action_hash=(question.action or {}).get("hash", ""),
        )
        return None

    def _fail(
        self, attempt: Attempt, failure_class: str | None, exc: BaseException, message: str = ""
    ) -> None:
        attempt.status = "failed"
        attempt.error = {
            "type": "HoldpointError" if isinstance(exc, HoldpointError) else type(exc).__name__,
            "message": message or str(exc) or type(exc).__name__,
            "step": attempt.step,
        }
        if failure_class:
            attempt.error["class"] = failure_class

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
) -> RunResult:
    """Run ``agent`` on ``input`` in memory until it succeeds, fails or waits for a person.

    ``answers``: the answers to its ``ask`` questions, in the order they are asked.
    ``approvals``: the decisions on its approvals (``ctx.approve`` and an irreversible
    tool's), in order: ``True``/``"approve"``, ``False``/``"deny"`` or ``{"decision":
    …, "comment": …}``. ``preapproved``: hold-point keys approved when the run was started
    (``approvals=[…]`` of ``run_start``). ``tools``: fakes by tool name (others are a
    ``FakeTool`` like the registered tool). ``crash_after``: a step name or a side effect's
    key (or several), where the worker dies once. ``seed``: the backoff jitter's.
    """
    from runs.schemas import validate_value

    input = _as_json(input)
    if agent.input_schema:
        validate_value(compile_schema(agent.input_schema), input, what="input")
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
    )
    result = run.run(max_attempts)
    if run.crash_points:
        raise HarnessError(
            f"crash_after {sorted(run.crash_points)} was never reached: no step of that name "
            "returned and no side effect of that key acted."
        )
    return result
