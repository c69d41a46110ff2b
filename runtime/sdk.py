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

This module only gathers the SDK's names. The SDK is written once, in the client package
``holdpoint_client`` (the values and errors in ``types``, the step's ``ctx`` in
``context``, the executor, the control); the agent class here (``runtime/agent.py``) is
its ``Agent``, registered with the server when created. Nothing here needs Django
configured: an agent module and its tests import it without a server (``import
runtime.sdk`` works in any Python process), and the same agent runs in process
(``runagents``), over HTTP (``holdpoint-worker``) or in memory
(``holdpoint_client.testing.run_agent``) by how it is started.
"""

from __future__ import annotations

# All the client package's: the values (a step's results, an approval, the retry policy),
# the step's ``ctx`` and the errors a step raises.
from holdpoint_client import Approval, Confirmed, Done, Next, RetryPolicy
from holdpoint_client.context import Context
from holdpoint_client.types import (
    ApprovalDenied,
    CostBudgetExceeded,
    Deterministic,
    EditRefused,
    SideEffectFailed,
    StepError,
    Transient,
)

from runtime.agent import Agent, StepFunction

__all__ = [
    "Agent",
    "Approval",
    "ApprovalDenied",
    "Confirmed",
    "Context",
    "CostBudgetExceeded",
    "Deterministic",
    "Done",
    "EditRefused",
    "Next",
    "RetryPolicy",
    "SideEffectFailed",
    "StepError",
    "StepFunction",
    "Transient",
]
