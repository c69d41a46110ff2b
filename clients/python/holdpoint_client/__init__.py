"""Holdpoint agents in any Python process: the model of ``runtime.sdk`` over the worker
protocol (docs/protocol.md). Depends on httpx only; no Django.

Moving an agent out of the server is one import::

    from holdpoint_client import Agent, Context, Next, Done   # was: from runtime.sdk import …
"""

from __future__ import annotations

from holdpoint_client.agent import Agent, StepFunction
from holdpoint_client.context import Context
from holdpoint_client.http import Api, Problem, ServerAway
from holdpoint_client.tools import (
    ActionFailed,
    Outcome,
    OutcomeUnknown,
    Tool,
    ToolResult,
    WebhookTool,
)
from holdpoint_client.types import (
    Approval,
    ApprovalDenied,
    Confirmed,
    CostBudgetExceeded,
    Deterministic,
    Done,
    EditRefused,
    Next,
    RetryPolicy,
    SideEffectFailed,
    StepError,
    Transient,
)
from holdpoint_client.worker import Worker

__all__ = [
    "ActionFailed",
    "Agent",
    "Api",
    "Approval",
    "ApprovalDenied",
    "Confirmed",
    "Context",
    "CostBudgetExceeded",
    "Deterministic",
    "Done",
    "EditRefused",
    "Next",
    "Outcome",
    "OutcomeUnknown",
    "Problem",
    "RetryPolicy",
    "ServerAway",
    "SideEffectFailed",
    "StepError",
    "StepFunction",
    "Tool",
    "ToolResult",
    "Transient",
    "WebhookTool",
    "Worker",
]
