"""Run one claimed attempt: steps, checkpoints at step boundaries, and the attempt's end.

The same loop as the server's in-process executor (``runtime/executor.py``): start from
the lease's checkpoint (or save the first one), run the step it names, save the next
checkpoint when the step returns ``Next``, complete on ``Done``; a hold point ends the
attempt; an exception fails it (classified); cancel is acknowledged with a release;
pause and shutdown stop at the next step boundary.
"""

from __future__ import annotations

import enum
import logging
import threading
from decimal import Decimal
from typing import Any

from holdpoint_client.agent import Agent
from holdpoint_client.context import Context, to_json
from holdpoint_client.control import (
    AttemptControl,
    CancelRequested,
    Heartbeater,
    HoldPointReached,
    LeaseLost,
    SideEffectUnknown,
)
from holdpoint_client.http import Api, Problem, ServerAway
from holdpoint_client.types import Done, Next, StepError

logger = logging.getLogger("holdpoint_client")


class Outcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"
    PAUSED = "paused"
    RELEASED = "released"
    ABANDONED = "abandoned"


def execute(
    api: Api,
    agent: Agent,
    lease: dict[str, Any],
    *,
    shutdown: threading.Event,
    control: AttemptControl | None = None,
) -> Outcome:
    control = control or AttemptControl(api, lease, shutdown)
    beater = Heartbeater(control)
    beater.start()
    try:
        outcome = _Attempt(agent, control).run()
    finally:
        beater.stop()
    logger.info(
        "attempt %s (run %s, %s #%s): %s",
        lease["attempt_id"],
        lease["run_id"],
        lease["agent"],
        lease["number"],
        outcome,
    )
    return outcome


class _Attempt:
    def __init__(self, agent: Agent, control: AttemptControl) -> None:
        self.agent = agent
        self.control = control
        self.lease = control.lease
        self.step = ""

    def run(self) -> Outcome:
        try:
            return self._run()
        except HoldPointReached:
            return Outcome.INTERRUPTED
        except CancelRequested:
            return self._release("cancelled")
        except LeaseLost:
            return Outcome.ABANDONED
        except (Problem, ServerAway) as exc:
            logger.error("attempt %s: giving up the attempt: %s", self.lease["attempt_id"], exc)
            return Outcome.ABANDONED

    def _run(self) -> Outcome:
        agent, control, lease = self.agent, self.control, self.lease
        if agent.start is None:
            return self._fail(
                "deterministic", "UnknownAgent", f"Agent {agent.name!r} has no steps."
            )
        resume = lease.get("resume_from")
        if resume:
            step, state, checkpoint_id = resume["step"], resume["state"], resume["checkpoint_id"]
            answers = {a["step_id"]: a for a in lease.get("answers") or []}
            resumed = True
        else:
            step, state = agent.start, {}
            first = control.write("checkpoint", {"step": step, "state": state})
            checkpoint_id = first["checkpoint_id"]
            if first.get("pause_requested"):
                control.request_pause("checkpoint answer")
            answers, resumed = {}, False
        continued = any(a.get("kind") == "pause" for a in answers.values())
        cost_before = Decimal(str(lease.get("run_cost") or "0"))
        pause_before = lease.get("pause_before") or []
        while True:
            self.step = step
            if step not in agent.steps:
                return self._fail(
                    "deterministic",
                    "UnknownStep",
                    f"Checkpoint {checkpoint_id} names step {step!r}, which agent "
                    f"{agent.name!r} does not have (its steps are {', '.join(agent.steps)}).",
                )
            if control.shutdown.is_set():
                return self._release("shutdown")
            control.check()
            if control.pause.is_set():
                return self._release("paused")
            if step in pause_before and not continued:
                control.finishing.set()
                control.write(
                    "interrupt",
                    {
                        "checkpoint_id": checkpoint_id,
                        "kind": "pause",
                        "prompt": f"breakpoint before {step}",
                        "context": {"breakpoint": step},
                    },
                )
                return Outcome.PAUSED
            continued = False
            ctx = Context(
                control=control,
                tools=agent.tools,
                approval_policy=agent.approval_policy,
                step=step,
                checkpoint_id=checkpoint_id,
                answers=answers,
                resumed=resumed,
                cost_before=cost_before,
                cost_budget=agent.retry.cost_budget,
            )
            try:
                result = agent.steps[step](ctx, to_json(state, "state"))
            except SideEffectUnknown as exc:
                return self._fail("side_effect_unknown", "SideEffectUnknown", exc.message)
            except StepError as exc:
                return self._fail_from(exc, exc.failure_class)
            except Problem as exc:
                # The server refused what the step asked for (a bad schema, a bad expiry):
                # the agent's code is wrong, and running it again will not help.
                return self._fail("deterministic", "Refused", f"{exc.code}: {exc.detail}")
            except Exception as exc:  # noqa: BLE001 - the agent's own code may raise anything
                return self._fail_from(exc, None)
            control.check()
            if isinstance(result, Done):
                try:
                    value = to_json(result.result, "result")
                except TypeError as exc:
                    return self._fail("deterministic", "ResultNotJSON", str(exc))
                control.finishing.set()
                control.write("complete", {"result": value})
                return Outcome.SUCCEEDED
            if not isinstance(result, Next):
                return self._fail(
                    "deterministic",
                    "BadStepResult",
                    f"Step {step!r} returned {type(result).__name__}; a step returns "
                    "ctx.next(step, state) or ctx.done(result).",
                )
            if result.step not in agent.steps:
                return self._fail(
                    "deterministic",
                    "UnknownStep",
                    f"Step {step!r} asked for step {result.step!r}, which agent "
                    f"{agent.name!r} does not have; its steps are {', '.join(agent.steps)}.",
                )
            try:
                state = to_json(result.state, "state")
            except TypeError as exc:
                return self._fail("deterministic", "StateNotJSON", str(exc))
            saved = control.write("checkpoint", {"step": result.step, "state": state})
            checkpoint_id = saved["checkpoint_id"]
            if saved.get("pause_requested"):
                control.request_pause("checkpoint answer")
            step, answers, resumed = result.step, {}, False

    def _fail_from(self, exc: BaseException, failure_class: str | None) -> Outcome:
        logger.warning("attempt %s: step %r raised %s", self.lease["attempt_id"], self.step, exc)
        return self._fail(failure_class, type(exc).__name__, str(exc) or type(exc).__name__)

    def _fail(self, failure_class: str | None, error_type: str, message: str) -> Outcome:
        error: dict[str, Any] = {
            "type": error_type[:200],
            "message": message[:10_000],
            "step": self.step[:100],
        }
        if failure_class:
            error["class"] = failure_class
        self.control.finishing.set()
        self.control.write("fail", {"error": error})
        return Outcome.FAILED

    def _release(self, reason: str) -> Outcome:
        self.control.finishing.set()
        if self.control.release(reason) is None:
            return Outcome.ABANDONED
        if reason == "paused":
            return Outcome.PAUSED
        return Outcome.CANCELLED if reason == "cancelled" else Outcome.RELEASED
