"""Run one claimed attempt: steps, checkpoints at step boundaries, and the end of the attempt.

Written once, for every backend (``backend.py``). The loop, for an attempt that holds a
lease:

1. Start from the lease's ``resume_from`` checkpoint, or save the first checkpoint
   (the agent's start step, empty state) for a run that has none.
2. Run the step the checkpoint names. It returns ``Next(step, state)`` — save a new
   checkpoint and go on — or ``Done(result)`` — complete the run.
3. A hold point (``ctx.ask`` / ``ctx.approve``) has already saved its request on the
   current checkpoint; the attempt is over (``interrupted``).
4. An exception fails the attempt; the store classifies it and backs off or stops.
   An attempt resumed with an approval must use it: a step that ends without using it
   (nor asking anew) fails ``ApprovalNotApplied``; a step that raises ``EditRefused``
   asks the same approval again (``approvals.py``).
5. A pause (heartbeat, notification, or the answer of the checkpoint just saved) is
   honoured at the step boundary: the step that runs finishes and its next checkpoint
   is saved, then the attempt is released with reason ``paused``. A breakpoint
   (``pause_before``) pauses at the boundary before its step, every time it is reached,
   except right after a person continued the run from that very checkpoint.
6. A cancel (heartbeat, notification, or a write refused ``stale_after_cancel``) is
   acknowledged with a release (``cancelled``); a write refused ``stale_worker``
   abandons the attempt without another write; a shutdown releases the attempt after
   the current step, so another worker goes on from its checkpoint.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from holdpoint_client.approvals import OwedApproval, no_edit_to_refuse, owed_approval
from holdpoint_client.backend import Backend, HoldPoint, Refused, to_json
from holdpoint_client.context import Context
from holdpoint_client.control import (
    CancelRequested,
    HoldPointReached,
    LeaseLost,
    SideEffectUnknown,
    StepTimeout,
)
from holdpoint_client.steps import run_step
from holdpoint_client.types import ApprovalNotApplied, Done, EditRefused, Next, StepError

logger = logging.getLogger("holdpoint_client")


class Outcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"
    PAUSED = "paused"
    RELEASED = "released"
    ABANDONED = "abandoned"


def run_attempt(
    agent: Any, backend: Backend, *, gone: tuple[type[BaseException], ...] = ()
) -> Outcome:
    """Run the attempt ``backend`` holds for ``agent`` until it ends; return how it ended.

    ``gone``: the backend's errors after which the attempt is given up without another
    write (the database or the server went away): the lease runs out, and the store
    starts a new attempt from the checkpoint.
    """
    return _Attempt(agent, backend, gone).run()


class _Attempt:
    def __init__(self, agent: Any, backend: Backend, gone: tuple[type[BaseException], ...]) -> None:
        self.agent = agent
        self.backend = backend
        self.control = backend.control
        self.lease = backend.lease
        self.gone = gone
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
        except Refused as exc:
            # A write the runtime itself made was refused: give the attempt up; the lease
            # will run out and a new attempt starts from the checkpoint.
            logger.error("attempt %s: giving up the attempt: %s", self.lease.attempt_id, exc)
            return Outcome.ABANDONED
        except Exception as exc:
            if not isinstance(exc, self.gone):
                raise
            logger.exception("attempt %s: giving up the attempt: %s", self.lease.attempt_id, exc)
            return Outcome.ABANDONED

    def _run(self) -> Outcome:
        agent, backend, control, lease = self.agent, self.backend, self.control, self.lease
        if agent is None or agent.start is None:
            return self._fail(
                "deterministic",
                "UnknownAgent",
                f"This worker has no agent named {lease.agent!r} with steps.",
            )
        if lease.resume_from:
            step = lease.resume_from["step"]
            state = lease.resume_from["state"]
            checkpoint_id = str(lease.resume_from["checkpoint_id"])
            answers = dict(lease.answers)
            resumed = True
        else:
            step, state = agent.start, {}
            checkpoint_id, pause = backend.checkpoint(step=step, state=state)
            if pause:
                control.request_pause("checkpoint answer")
            answers, resumed = {}, False
        # Continued by a person from this checkpoint: its breakpoint was the reason it stopped.
        continued = any(answer.kind == "pause" for answer in answers.values())
        # What people approved, which the step run from the resumed checkpoint must use.
        owed: OwedApproval | None = (
            owed_approval(lease.resume_request) if lease.resume_from else None
        )
        while True:
            self.step = step
            if step not in agent.steps:
                return self._fail(
                    "deterministic",
                    "UnknownStep",
                    f"Checkpoint {checkpoint_id} names step {step!r}, which agent "
                    f"{agent.name!r} no longer has (its steps are {', '.join(agent.steps)}). "
                    "The code changed since the checkpoint was saved: deploy code that has "
                    "the step, or retry from a checkpoint whose step exists.",
                )
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
                backend=backend,
                step=step,
                checkpoint_id=checkpoint_id,
                answers=answers,
                resumed=resumed,
                cost_budget=agent.retry.cost_budget,
                input_type=getattr(agent, "input_type", None),
                timeout=options.timeout if options is not None else None,
                owed=owed,
            )
            try:
                result = run_step(agent.steps[step], ctx, to_json(state, "state"))
            except EditRefused as exc:
                ctx._ask_again_refused(exc)  # asks again (HoldPointReached) when it can
                return self._fail("deterministic", "EditRefused", no_edit_to_refuse(exc))
            except SideEffectUnknown as exc:
                return self._fail("side_effect_unknown", "SideEffectUnknown", exc.message)
            except StepTimeout as exc:
                return self._fail("transient", "StepTimeout", exc.message)
            except StepError as exc:
                return self._fail_from(exc, exc.failure_class)
            except Refused as exc:
                # The store refused what the step asked for (a bad schema, a bad expiry):
                # the agent's code is wrong, and running it again will not help.
                return self._fail("deterministic", backend.refused_type, str(exc))
            except Exception as exc:
                if isinstance(exc, self.gone):
                    raise
                return self._fail_from(exc, None)
            backend.step_ended(step)
            # The step is finished: this is the safe point between steps.
            control.check()
            not_applied = ctx._approval_not_applied()
            if not_applied is not None:
                return self._fail("deterministic", ApprovalNotApplied.__name__, not_applied)
            if isinstance(result, Done):
                try:
                    value = to_json(result.result, "result")
                except TypeError as exc:
                    return self._fail("deterministic", "ResultNotJSON", str(exc))
                control.finishing.set()
                backend.complete(result=value)
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
            checkpoint_id, pause = backend.checkpoint(step=result.step, state=state)
            if pause:
                control.request_pause("checkpoint answer")
            # Answers belong to the checkpoint they were asked on; this one is new.
            step, answers, resumed, owed = result.step, {}, False, None

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
        error: dict[str, Any] = {
            "type": error_type[:200],
            "message": message[:10_000],
            "step": self.step[:100],
        }
        if failure_class:
            error["class"] = failure_class
        self.control.finishing.set()
        self.backend.fail(error=error)
        return Outcome.FAILED

    def _breakpoint(self, step: str, checkpoint_id: str) -> Outcome:
        """Pause before ``step`` (a breakpoint): the run holds a pause request here."""
        self.control.finishing.set()
        self.backend.interrupt(
            HoldPoint(
                checkpoint_id=checkpoint_id,
                kind="pause",
                prompt=f"breakpoint before {step}",
                context={"breakpoint": step},
            )
        )
        return Outcome.PAUSED

    def _release(self, reason: str) -> Outcome:
        """Give the lease back: acknowledge a cancel, stop at a boundary for a pause, or
        hand the attempt on at shutdown."""
        self.control.finishing.set()
        if not self.backend.release(reason):
            # Someone else owns the run already; nothing more to write.
            return Outcome.ABANDONED
        if reason == "paused":
            return Outcome.PAUSED
        return Outcome.CANCELLED if reason == "cancelled" else Outcome.RELEASED
