"""``_Run``: one run of the harness: its checkpoints, answers, in-memory ledger and attempts."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from django.conf import settings

from ledger.tools import (
    ActionFailed,
    OutcomeUnknown,
    get_tool,
    request_errors,
)
from runs.approvals import approval_answer
from runs.errors import HoldpointError
from runs.schemas import compile_schema, validation_errors
from runtime.context import to_json
from runtime.control import StepTimeout
from runtime.steps import run_step
from runtime.testing.context import FakeContext
from runtime.testing.fakes import (
    Attempt,
    Crash,
    FakeClock,
    FakeTool,
    HarnessError,
    Question,
    RunResult,
    SideEffectRecord,
    _AnswerGiven,
    _approval_value,
    _as_json,
    _HoldPoint,
    _Unknown,
)
from runtime.types import (
    Approval,
    ApprovalDenied,
    Confirmed,
    Done,
    Next,
    SideEffectFailed,
    StepError,
)


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
            # The run store's rule for an approval's answer (runs/approvals.py): comment
            # required to deny or send back, an edit only of what is offered and fitting
            # its schema, an edit equal to the plan a plain approval.
            action = dict(question.action or {})
            if isinstance(action.get("editable"), dict):
                action["editable"] = {
                    **action["editable"],
                    "schema": compile_schema(action["editable"].get("schema")),
                }
            try:
                value = approval_answer(action, value)
            except HoldpointError as exc:
                errors = exc.extra.get("errors") or []
                raise HarnessError(
                    f"The approval {value!r} of {question.key!r} does not fit: {exc.detail} "
                    + "; ".join(f"{e['pointer']}: {e['message']}" for e in errors)
                ) from None
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
