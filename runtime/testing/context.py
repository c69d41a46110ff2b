"""``FakeContext``: the ``ctx`` of the harness, with every call of the real one."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from runs.schemas import compile_schema
from runtime.context import change_is_empty, fingerprint, hold_point_key, to_json
from runtime.control import StepTimeout
from runtime.questions import approval_options, choice_schema, typed_value
from runtime.testing.fakes import (
    HarnessError,
    Question,
    _AnswerGiven,
    _approval_value,
    _HoldPoint,
)
from runtime.typed import is_typed, schema_of
from runtime.types import (
    Approval,
    Confirmed,
    CostBudgetExceeded,
    Done,
    Next,
)

if TYPE_CHECKING:
    from runtime.testing.run import _Run


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
        editable: Any = None,
        arguments: Any = None,
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
            edited = value.get("edited")  # checked when the test gave it (run.py)
            return Approval(
                approved=value["decision"] == "approve",
                comment=str(value.get("comment") or ""),
                answered_by="tester",
                request_id=f"req_{step_id}",
                decision=str(value["decision"]),
                edited=edited,
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
                    **(
                        {
                            "editable": {
                                "schema": to_json(editable, "editable schema"),
                                "value": to_json(
                                    change if arguments is None else arguments,
                                    "approval arguments",
                                ),
                            }
                        }
                        if editable is not None
                        else {}
                    ),
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
