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

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from runs.errors import HoldpointError


@dataclass(frozen=True)
class ToolResult:
    """What an action produced: the external system's reference and a JSON result."""

    external_reference: str
    result: Any = None


@dataclass(frozen=True)
class Outcome:
    """What ``lookup`` learned about an idempotency key."""

    status: Literal["confirmed", "failed"]
    external_reference: str = ""
    result: Any = None
    error: Any = None


class ToolError(Exception):
    """Base of what tools raise; ``as_error()`` is stored on the side effect."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def as_error(self) -> dict[str, Any]:
        error: dict[str, Any] = {"type": type(self).__name__, "message": self.message}
        if self.details:
            error["details"] = self.details
        return error


class OutcomeUnknown(ToolError):
    """The action may or may not have happened (a timeout once the request was sent)."""


class ActionFailed(ToolError):
    """The action certainly did not happen (refused, invalid, never sent)."""


@runtime_checkable
class Tool(Protocol):
    name: str
    reversibility: str

    def execute(self, request: Any, idempotency_key: str) -> ToolResult: ...

    def lookup(self, idempotency_key: str) -> Outcome | None: ...


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
    """Return the registered tool (or a declared remote one), else raise ``invalid_input``."""
    tool = _registry.get(name)
    if tool is None:
        from runs.services import declared_tool

        declared = declared_tool(name)
        if declared is not None:
            return RemoteTool(name, declared.get("reversibility") or "irreversible")
        raise HoldpointError(
            "invalid_input",
            f"There is no tool named {name!r}; known tools: {', '.join(sorted(_registry)) or 'none'}.",
            tool=name,
        )
    return tool


def tool_of_agent(agent: str, name: str) -> Tool:
    """The tool that performed (and alone can be asked about) an effect of a run of
    ``agent``: a tool the agent declared as running in its own process is a ``RemoteTool``
    even where this process registers another tool under the same name; asking that other
    tool about the agent's key would hear "no record" of an act that did happen."""
    from runs.services import agents_declaring_tool, declared_tool

    if agent in agents_declaring_tool(name):
        declared = declared_tool(name) or {}
        return RemoteTool(name, declared.get("reversibility") or "irreversible")
    return get_tool(name)


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
    "tool_of_agent",
    "unregister_tool",
]
