"""The agent SDK: what an agent author writes against (``from runtime.sdk import …``).

An agent is a named set of steps. A step is a plain function ``step(ctx, state)``
that returns ``ctx.next("other_step", new_state)`` or ``ctx.done(result)``::

    deploy = Agent(name="deploy", input_schema={"service": "string"})

    @deploy.step("plan", start=True)
    def plan(ctx: Context, state: dict) -> Next | Done:
        versions = ctx.ask("Which versions?", {"versions": "string[]"})
        return ctx.next("apply", {"versions": versions["versions"]})

The runtime saves a checkpoint (the step to run next and its state) at every step
boundary, so a step is the unit of work that is repeated after a crash or a
resume. The rules that follow from that are in ``docs/agents.md``.

This module only gathers the SDK's names: the values and errors are in
``runtime/types.py``, the agent class in ``runtime/agent.py``, the step's ``ctx`` in
``runtime/context.py``. Agent modules are imported once the apps are ready
(``runtime/apps.py``), so importing the run store from here is safe.
"""

from __future__ import annotations

from runs.agents import RetryPolicy
from runtime.agent import Agent, StepFunction
from runtime.context import Context
from runtime.types import (
    Approval,
    ApprovalDenied,
    Confirmed,
    CostBudgetExceeded,
    Deterministic,
    Done,
    Next,
    SideEffectFailed,
    StepError,
    Transient,
)

__all__ = [
    "Agent",
    "Approval",
    "ApprovalDenied",
    "Confirmed",
    "Context",
    "CostBudgetExceeded",
    "Deterministic",
    "Done",
    "Next",
    "RetryPolicy",
    "SideEffectFailed",
    "StepError",
    "StepFunction",
    "Transient",
]
