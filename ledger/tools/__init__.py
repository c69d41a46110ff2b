"""Tools: adapters that act on the world on behalf of an agent.

A tool is any object with

- ``name`` and ``reversibility`` (``reversible``, ``compensable`` or ``irreversible``);
- ``execute(request, idempotency_key) -> ToolResult``: perform the action, passing the
  key to the external system so that a repeat with the same key is not a second act;
- ``lookup(idempotency_key) -> Outcome | None``: ask the external system what became
  of the key; ``None`` means it has no record, so the action did not happen;

and optionally

- ``compensate(side_effect) -> ToolResult``: undo (or offset) a confirmed effect, using
  ``side_effect.compensation_idempotency_key`` as its own key;
- ``validate(request)``: raise ``ActionFailed`` for a request that can never succeed,
  so that it is refused before anything is written;
- ``can_look_up``: ``False`` when ``lookup`` can never tell (e-mail), so that the
  reconciler does not ask in vain;
- ``plan_compensation(request) -> dict | None``: what would undo the action, shown to
  the person who approves it and stored on the side effect;
- ``request_schema``: the JSON Schema of ``request``. The ledger checks every request
  against it before anything is written (``request_errors``), so a mistyped field is
  refused with a pointer to it (docs/tools.md documents each shipped tool's schema).
- ``edit_schema`` (optional): the form a person approving an irreversible call may edit
  the request in before approving (the edited request is what runs, and must still fit
  ``request_schema``). The e-mail tool has one.

``execute``, ``lookup`` and ``compensate`` raise ``OutcomeUnknown`` when they cannot
tell whether the action happened (a timeout after the request was sent), and
``ActionFailed`` when it certainly did not. They are called outside any database
transaction (STYLE rule 8).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# The tool interface is the agent SDK's (one definition for the server's tools and an
# agent's own): the values a tool returns and the errors it raises.
from holdpoint_client.tools import (
    ActionFailed,
    Outcome,
    OutcomeUnknown,
    Tool,
    ToolError,
    ToolResult,
)

from runs.errors import HoldpointError

if TYPE_CHECKING:
    from runs.services.approvals import ToolFacts


_registry: dict[str, Tool] = {}


def register_tool(tool: Tool) -> Tool:
    """Register ``tool`` under its name, replacing any tool of that name."""
    if not isinstance(tool, Tool):
        raise TypeError(f"{tool!r} does not implement the Tool protocol")
    if tool.reversibility not in {"reversible", "compensable", "irreversible"}:
        raise ValueError(f"tool {tool.name!r} has an unknown reversibility {tool.reversibility!r}")
    _registry[tool.name] = tool
    return tool


def unregister_tool(name: str) -> None:
    _registry.pop(name, None)


class RemoteTool:
    """A tool that runs in a remote agent's process (declared with ``PUT /api/agents/{name}``).

    The ledger decides for it (act, look up, reuse, refuse) as for any tool; the agent's
    process acts, looks up and reports the outcome. Here it can do neither: a look-up by
    the reconciler cannot tell (``can_look_up`` is false), so an effect whose worker
    vanished is looked up by the next attempt of the agent, or settled by a person.
    """

    can_look_up = False

    def __init__(self, name: str, reversibility: str) -> None:
        self.name = name
        self.reversibility = reversibility

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        raise ActionFailed(f"The {self.name} tool runs in the agent's process, not here.")

    def lookup(self, idempotency_key: str) -> Outcome | None:
        raise OutcomeUnknown(f"The {self.name} tool runs in the agent's process; it looks up.")


def get_tool(name: str) -> Tool:
    """Return the tool this process registered under ``name``, else raise ``invalid_input``.

    Only this process's tools: a tool an agent declared as running in its own process
    belongs to that agent (``tool_for_agent``), never to whoever asks by its name."""
    tool = _registry.get(name)
    if tool is None:
        raise HoldpointError(
            "invalid_input",
            f"There is no tool named {name!r}; known tools: {', '.join(sorted(_registry)) or 'none'}.",
            tool=name,
        )
    return tool


_REVERSIBILITY_ORDER = ("irreversible", "compensable", "reversible")


def _least_reversible(a: str, b: str) -> str:
    return min(
        (a, b), key=lambda r: _REVERSIBILITY_ORDER.index(r) if r in _REVERSIBILITY_ORDER else 0
    )


def tool_for_agent(agent: str, name: str) -> Tool:
    """The tool that a run of ``agent`` calls ``name``, or raise ``invalid_input``.

    - A tool the agent declared as running in its own process (``PUT /api/agents/{name}``)
      is a ``RemoteTool`` with the agent's own declaration: no other agent's declaration
      of the same name counts, whoever declared last.
    - Else the tool this process registered (the shipped tools, an in-process agent's).
    - A tool of the server keeps the server's reversibility: an agent's declaration of the
      same name may make it less reversible, never more (the e-mail tool is irreversible
      whatever a worker says).
    """
    from runs.services import declared_tool_of

    registered = _registry.get(name)
    declared = declared_tool_of(agent, name)
    if declared is not None:
        reversibility = declared.get("reversibility") or "irreversible"
        if registered is not None:
            reversibility = _least_reversible(reversibility, registered.reversibility)
        return RemoteTool(name, reversibility)
    if registered is not None:
        return registered
    raise HoldpointError(
        "invalid_input",
        f"Agent {agent!r} has no tool named {name!r}: declare it with the agent "
        f"(PUT /api/agents/{agent}), or use one of {', '.join(sorted(_registry)) or 'none'}.",
        tool=name,
        agent=agent,
    )


def tool_facts(agent: str, name: str) -> ToolFacts | None:
    """What the run store needs to judge an approval about ``name`` in a run of ``agent``
    (registered into ``runs.services.register_tool_facts``): its reversibility, whether it
    can undo a call it made, and its request schema; None when the agent has no such tool."""
    try:
        tool = tool_for_agent(agent, name)
    except HoldpointError:
        return None
    schema = getattr(tool, "request_schema", None)
    return {
        "reversibility": tool.reversibility,
        "can_compensate": can_compensate(tool),
        "request_schema": schema if isinstance(schema, dict) else None,
    }


def registered_tools() -> list[Tool]:
    return [_registry[name] for name in sorted(_registry)]


def request_errors(tool: Tool, request: Any) -> list[dict[str, str]]:
    """How ``request`` breaks the tool's ``request_schema``: ``[{pointer, message}]``,
    empty when it fits or the tool declares no schema."""
    from runs.schemas import validation_errors

    schema = getattr(tool, "request_schema", None)
    if not isinstance(schema, dict):
        return []
    return validation_errors(schema, request)


def can_compensate(tool: Tool) -> bool:
    return callable(getattr(tool, "compensate", None))


def can_look_up(tool: Tool) -> bool:
    return bool(getattr(tool, "can_look_up", True))


def register_default_tools() -> None:
    """Register the shipped tools under their names unless something already took them."""
    from ledger.tools.config_store import ConfigStoreTool
    from ledger.tools.mail import EmailTool
    from ledger.tools.webhook import WebhookTool

    for tool in (WebhookTool(), ConfigStoreTool(), EmailTool()):
        if tool.name not in _registry:
            register_tool(tool)


__all__ = [
    "ActionFailed",
    "Outcome",
    "OutcomeUnknown",
    "RemoteTool",
    "Tool",
    "ToolError",
    "ToolResult",
    "can_compensate",
    "can_look_up",
    "get_tool",
    "register_default_tools",
    "register_tool",
    "registered_tools",
    "request_errors",
    "tool_facts",
    "tool_for_agent",
    "unregister_tool",
]
