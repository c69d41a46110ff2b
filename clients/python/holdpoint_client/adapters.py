"""What the adapters that run another framework's agent under Holdpoint share
(``holdpoint_client.langgraph``, ``holdpoint_client.openai_agents``): the Holdpoint step
that is running now, seen from the framework's code (a LangGraph node, an OpenAI Agents
SDK tool), its side effects through the ledger, and the form an approval card edits a tool
call's arguments with.

The adapters run the framework inside one Holdpoint step (a LangGraph superstep, an
OpenAI Agents SDK turn) and set ``step(ctx, number)`` around it, so that code deep in the
framework reaches the step's ``ctx`` without being handed it. No framework is imported.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from holdpoint_client.context import Context
from holdpoint_client.types import Confirmed

_current: contextvars.ContextVar[Superstep | None] = contextvars.ContextVar(
    "holdpoint_adapter_step", default=None
)


class Superstep:
    """The Holdpoint side of one framework step: its ctx, its number, its call counters."""

    def __init__(self, ctx: Context, number: int) -> None:
        self.ctx = ctx
        self.number = number
        self.counts: dict[str, int] = {}

    def key(self, kind: str) -> str:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        n = self.counts[kind]
        return f"s{self.number}.{kind}" if n == 1 else f"s{self.number}.{kind}#{n}"


@contextmanager
def step(ctx: Context, number: int) -> Iterator[Superstep]:
    """Run the framework's step ``number`` with ``ctx`` as the current Holdpoint step.

    Context variables reach the framework's threads and asyncio tasks (both copy them when
    they start), so ``current_context`` and ``side_effect`` work in a node or a tool."""
    current = Superstep(ctx, number)
    token = _current.set(current)
    try:
        yield current
    finally:
        _current.reset(token)


def current_context() -> Context:
    """The Holdpoint ``ctx`` of the step running now (log, cost, observe from a LangGraph
    node or an OpenAI Agents SDK tool)."""
    current = _current.get()
    if current is None:
        raise RuntimeError(
            "Not inside a LangGraph node or an OpenAI Agents SDK tool run by holdpoint_client."
        )
    return current.ctx


def side_effect(
    tool: str,
    target: str,
    request: dict[str, Any],
    *,
    compensate: dict[str, Any] | None = None,
    reversibility: str | None = None,
    key: str | None = None,
) -> Confirmed:
    """A tool call that acts on the world, from inside a node or a tool, through the ledger.

    Its key is the step's number and the call's order in the step (or ``key``), so the step
    run again after a resume or a crash finds the same record and never acts twice.
    """
    current = _current.get()
    if current is None:
        raise RuntimeError(
            "side_effect is called from a LangGraph node or an OpenAI Agents SDK tool run by "
            "Holdpoint."
        )
    return current.ctx.side_effect(
        tool,
        target,
        request,
        compensate=compensate,
        reversibility=reversibility,
        key=key or current.key(tool),
    )


def args_schema(args: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema for a tool call's arguments, one field per argument typed by its planned
    value, so that the approval card's form can edit them (anything else: a JSON field)."""
    properties: dict[str, Any] = {}
    for name, value in args.items():
        if isinstance(value, bool):
            field: dict[str, Any] = {"type": "boolean"}
        elif isinstance(value, int):
            field = {"type": "integer"}
        elif isinstance(value, float):
            field = {"type": "number"}
        elif isinstance(value, str):
            field = {"type": "string"}
            if len(value) > 80 or "\n" in value:
                field["maxLength"] = 10_000  # A text area.
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            field = {"type": "array", "items": {"type": "string"}}
        else:
            field = {}
        properties[str(name)] = field
    # Required means not empty (docs/agents.md): only arguments the plan fills in.
    required = [
        str(name)
        for name, value in args.items()
        if value is not None and value != [] and not (isinstance(value, str) and not value.strip())
    ]
    return {"type": "object", "properties": properties, "required": required}
