"""Run one claimed attempt: steps, checkpoints at step boundaries, and the end of the attempt.

The loop, for an attempt that holds a lease:

1. Start from the lease's ``resume_from`` checkpoint, or save the first checkpoint
   (the agent's start step, empty state) for a run that has none.
2. Run the step the checkpoint names. It returns ``Next(step, state)`` — save a new
   checkpoint and go on — or ``Done(result)`` — complete the run.
3. A hold point (``ctx.ask`` / ``ctx.approve``) has already saved its request on the
   current checkpoint; the attempt is over (``interrupted``).
4. An exception fails the attempt; the run store classifies it and backs off or stops.
5. A pause (heartbeat, notification, or the answer of the checkpoint just saved) is
   honoured at the step boundary: the step that runs finishes and its next checkpoint
   is saved, then the attempt is released with reason ``paused``. A breakpoint
   (``pause_before``) pauses at the boundary before its step, every time it is reached,
   except right after a person continued the run from that very checkpoint.
6. A cancel (heartbeat, notification, or a write refused ``stale_after_cancel``) is
   acknowledged with ``attempt_release(reason="cancelled")``; a write refused
   ``stale_worker`` abandons the attempt without another write; a shutdown releases the
   attempt after the current step, so another worker goes on from its checkpoint.
"""

from __future__ import annotations

import enum
import logging
import threading
from decimal import Decimal
from typing import Any

from django.db import DatabaseError

from runs import services
from runs.errors import HoldpointError
from runs.logcontext import bind
from runs.services import Lease
from runtime import registry
from runtime.context import Context, to_json
from runtime.control import (
    AttemptControl,
    CancelRequested,
    HoldPointReached,
    LeaseLost,
    SideEffectUnknown,
    StepTimeout,
)
from runtime.heartbeat import Heartbeater
from runtime.registry import Agent
from runtime.selectors import answers_for, run_cost_before
from runtime.steps import run_step
from runtime.types import Done, Next, StepError

logger = logging.getLogger("runtime")


class Outcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"
    PAUSED = "paused"
    RELEASED = "released"
    ABANDONED = "abandoned"


def execute(
    lease: Lease,
    *,
    shutdown: threading.Event | None = None,
    control: AttemptControl | None = None,
    heartbeat: bool = True,
) -> Outcome:
    """Run the attempt ``lease`` until it ends; return how it ended.

    With ``heartbeat`` a separate thread renews the lease every ``lease_seconds / 3``.
    """
    control = control or AttemptControl(lease, shutdown)
    beater = Heartbeater(control) if heartbeat else None
    if beater is not None:
        beater.start()
    try:
        # Every log line of this attempt, in this thread, carries its run and attempt ids.
        with bind(run_id=lease.run_id, attempt_id=lease.attempt_id):
            outcome = _Attempt(lease, control).run()
    finally:
        if beater is not None:
            beater.stop()
    logger.info(
        "attempt %s (run %s, %s #%d): %s",
        lease.attempt_id,
        lease.run_id,
        lease.agent,
        lease.number,
        outcome,
    )
    return outcome


class _Attempt:
    def __init__(self, lease: Lease, control: AttemptControl) -> None:
        self.lease = lease
        self.control = control
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
        except (HoldpointError, DatabaseError) as exc:
            # A write the runtime itself made was refused or the database went away: the
            # lease will run out and the sweep will start a new attempt from the checkpoint.
            logger.exception("attempt %s: giving up the attempt: %s", self.lease.attempt_id, exc)
            return Outcome.ABANDONED

    def _run(self) -> Outcome:
        lease, control = self.lease, self.control
        agent = registry.get_agent(lease.agent)
        if agent is None or agent.start is None:
            return self._fail(
                "deterministic",
                "UnknownAgent",
                f"This worker has no agent named {lease.agent!r} with steps.",
            )
        if lease.resume_from:
            step = lease.resume_from["step"]
            state = lease.resume_from["state"]
            checkpoint_id = lease.resume_from["checkpoint_id"]
            answers = answers_for(lease)
            resumed = True
        else:
            step, state = agent.start, {}
            first = control.write(services.checkpoint_save, step=step, state=state)
            checkpoint_id = first.id
            if first.pause_requested:
                control.request_pause("checkpoint answer")
            answers, resumed = {}, False
        # Continued by a person from this checkpoint: its breakpoint was the reason it stopped.
        continued = any(answer.kind == "pause" for answer in answers.values())
        cost_before = Decimal(str(run_cost_before(lease)))
        while True:
            self.step = step
            if step not in agent.steps:
                return self._unknown_step(agent, step, checkpoint_id)
            if control.shutdown.is_set():
                return self._release("shutdown")
            control.check()
            # The step boundary: the previous step committed and this checkpoint is saved.
            if control.pause.is_set():
                return self._release("paused")
            if step in lease.pause_before and not continued:
                return self._breakpoint(step, checkpoint_id)
            continued = False
            options = getattr(agent, "step_options", {}).get(step)
            ctx = Context(
                control=control,
                step=step,
                checkpoint_id=checkpoint_id,
                answers=answers,
                resumed=resumed,
                cost_before=cost_before,
                cost_budget=agent.retry.cost_budget,
                input_type=getattr(agent, "input_type", None),
                timeout=options.timeout if options is not None else None,
            )
            try:
                result = run_step(agent.steps[step], ctx, to_json(state, "state"))
            except SideEffectUnknown as exc:
                return self._fail("side_effect_unknown", "SideEffectUnknown", exc.message)
            except StepTimeout as exc:
                return self._fail("transient", "StepTimeout", exc.message)
            except StepError as exc:
                return self._fail_from(exc, exc.failure_class)
            except HoldpointError as exc:
                # The run store refused what the step asked for (a bad schema, a bad expiry):
                # the agent's code is wrong, and running it again will not help.
                return self._fail("deterministic", "HoldpointError", f"{exc.code}: {exc.detail}")
            except Exception as exc:  # noqa: BLE001 - the agent's own code may raise anything: classify it
                return self._fail_from(exc, None)
            # The step is finished: this is the safe point between steps.
            control.check()
            if isinstance(result, Done):
                try:
                    value = to_json(result.result, "result")
                except TypeError as exc:
                    return self._fail("deterministic", "ResultNotJSON", str(exc))
                control.finishing.set()
                control.write(services.attempt_complete, result=value, cost=control.cost_arg())
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
            checkpoint = control.write(
                services.checkpoint_save,
                step=result.step,
                state=state,
                cost=control.cost_arg(),
            )
            checkpoint_id = checkpoint.id
            if checkpoint.pause_requested:
                control.request_pause("checkpoint answer")
            # Answers belong to the checkpoint they were asked on; this one is new.
            step, answers, resumed = result.step, {}, False

    def _unknown_step(self, agent: Agent, step: str, checkpoint_id: str) -> Outcome:
        return self._fail(
            "deterministic",
            "UnknownStep",
            f"Checkpoint {checkpoint_id} names step {step!r}, which agent {agent.name!r} no "
            f"longer has (its steps are {', '.join(agent.steps)}). The code changed since "
            "the checkpoint was saved: deploy code that has the step, or retry from a "
            "checkpoint whose step exists.",
        )

    def _fail_from(self, exc: BaseException, failure_class: str | None) -> Outcome:
        logger.warning(
            "attempt %s: step %r raised %s",
            self.lease.attempt_id,
            self.step,
            type(exc).__name__,
            exc_info=exc,
        )
        return self._fail(failure_class, type(exc).__name__, str(exc) or type(exc).__name__)

    def _fail(self, failure_class: str | None, error_type: str, message: str) -> Outcome:
        error: dict[str, Any] = {"type": error_type, "message": message, "step": self.step}
        if failure_class:
            error["class"] = failure_class
        self.control.finishing.set()
        self.control.write(services.attempt_fail, error=error, cost=self.control.cost_arg())
        return Outcome.FAILED

    def _breakpoint(self, step: str, checkpoint_id: str) -> Outcome:
        """Pause before ``step`` (a breakpoint): the run holds a pause request here."""
        self.control.finishing.set()
        self.control.write(
            services.attempt_interrupt,
            checkpoint_id=checkpoint_id,
            kind="pause",
            prompt=f"breakpoint before {step}",
            context={"breakpoint": step},
            cost=self.control.cost_arg(),
        )
        return Outcome.PAUSED

    def _release(self, reason: str) -> Outcome:
        """Give the lease back: acknowledge a cancel, stop at a boundary for a pause, or
        hand the attempt on at shutdown."""
        self.control.finishing.set()
        try:
            services.attempt_release(
                attempt_id=self.lease.attempt_id,
                lease_epoch=self.lease.lease_epoch,
                reason=reason,
            )
        except HoldpointError as exc:
            # stale_worker: someone else owns the run already; nothing more to write.
            logger.info("attempt %s: release refused: %s", self.lease.attempt_id, exc.code)
            return Outcome.ABANDONED
        if reason == "paused":
            return Outcome.PAUSED
        return Outcome.CANCELLED if reason == "cancelled" else Outcome.RELEASED
