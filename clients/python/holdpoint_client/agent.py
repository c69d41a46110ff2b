"""``Agent``: a name, an input schema, a retry policy, tools and steps: the one agent class.

How an agent is started decides where it runs, not its code: ``holdpoint-worker
module:agent`` (or ``Worker``) declares it to the server (``PUT /api/agents/{name}``) and
serves it over HTTP; ``manage.py runagents`` serves the agents of the modules named in
``HOLDPOINT_AGENT_MODULES`` in the server's process (``runtime.sdk.Agent`` is this class,
registered with the server when it is created there); ``holdpoint_client.testing.run_agent``
runs it in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

from holdpoint_client.tools import REVERSIBILITIES, Tool, WebhookTool
from holdpoint_client.typed import is_typed, schema_of
from holdpoint_client.types import Done, Next, RetryPolicy

if TYPE_CHECKING:
    from holdpoint_client.context import Context

StepFunction = Callable[["Context", Any], "Next | Done"]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class StepOptions:
    """``@agent.step(timeout=…, retry=…)``: how long one run of the step may take (seconds;
    past it the step is stopped at its next safe point and fails transient,
    ``StepTimeout``), and the retry policy that replaces the agent's for its failures."""

    timeout: float | None = None
    retry: RetryPolicy | None = None


class Agent:
    def __init__(
        self,
        *,
        name: str,
        input_schema: dict[str, Any] | type | None = None,
        retry: RetryPolicy | None = None,
        description: str = "",
        tools: Iterable[Tool | str] = (),
        label: str = "",
        approval_policy: dict[str, Any] | None = None,
    ) -> None:
        """``tools``: tool objects that run in this process (``WebhookTool`` is always
        there), or names of the server's shipped tools. ``approval_policy``:
        ``{"ask_before": [tool names]}``, tools whose every call asks a person first.
        ``input_schema``: JSON Schema (or the compact form), or a Pydantic model or a
        dataclass (``typed.py``): its JSON Schema is what runs are checked against, and
        ``ctx.input`` is then an instance of it."""
        if not name or len(name) > 100:
            raise ValueError("An agent name must be 1 to 100 characters.")
        self.name = name
        self.input_type: type | None = None
        if isinstance(input_schema, type) and is_typed(input_schema):
            self.input_type = input_schema
            self.input_schema = schema_of(input_schema)
        elif isinstance(input_schema, type):
            raise TypeError("input_schema is JSON Schema, a Pydantic model or a dataclass.")
        else:
            self.input_schema = dict(input_schema or {})
        self.retry: RetryPolicy = retry or RetryPolicy()
        self.description = description
        self.label = label
        self.approval_policy = dict(approval_policy or {})
        self.tools: dict[str, Tool] = {"webhook": WebhookTool()}
        # Every tool the agent names: its own and the server's shipped ones (named only).
        names: list[str] = []
        for tool in tools:
            if isinstance(tool, str):
                names.append(tool)
                continue
            if tool.reversibility not in REVERSIBILITIES:
                raise ValueError(
                    f"tool {tool.name!r}: unknown reversibility {tool.reversibility!r}"
                )
            self.tools[tool.name] = tool
            names.append(tool.name)
        self.tool_names: tuple[str, ...] = tuple(dict.fromkeys(names))
        self.steps: dict[str, StepFunction] = {}
        self.step_options: dict[str, StepOptions] = {}
        self.start: str | None = None

    @overload
    def step(
        self,
        name: F,
        *,
        start: bool = False,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> F: ...

    @overload
    def step(
        self,
        name: str | None = None,
        *,
        start: bool = False,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Callable[[F], F]: ...

    def step(
        self,
        name: Any = None,
        *,
        start: bool = False,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Any:
        """Register a step: ``@agent.step``, ``@agent.step("name")`` or with ``start=True``.

        The first step registered is where a run starts unless another says ``start=True``.
        ``timeout`` (seconds): a run of the step past it is stopped at its next safe point
        (any ``ctx`` call) and fails transient (``StepTimeout``). ``retry``: a
        ``RetryPolicy`` that replaces the agent's for the failures of this step. A step may
        be an ``async def``: it runs on an event loop, with the same ``ctx`` and rules.
        """
        if timeout is not None and not timeout > 0:
            raise ValueError("A step timeout is a number of seconds above 0.")
        options = StepOptions(timeout=timeout, retry=retry)
        if callable(name):
            return self._add(name.__name__, name, start=start, options=options)

        def decorate(func: F) -> F:
            return self._add(name or func.__name__, func, start=start, options=options)

        return decorate

    def _add(self, name: str, func: F, *, start: bool, options: StepOptions) -> F:
        if not name or len(name) > 100:
            raise ValueError("A step name must be 1 to 100 characters.")
        if name in self.steps and self.steps[name] is not func:
            raise ValueError(f"Agent {self.name!r} already has a step named {name!r}.")
        self.steps[name] = func
        if options != StepOptions():
            self.step_options[name] = options
        if start or self.start is None:
            self.start = name
        self._changed()
        return func

    def own_tools(self) -> list[Tool]:
        """The tools that run in the agent's process, the built-in webhook aside (wherever
        the agent runs, the webhook is that side's own)."""
        return [tool for name, tool in self.tools.items() if name != "webhook"]

    def asks_before(self, tool: str) -> bool:
        """Whether every call of ``tool`` asks a person first (``approval_policy``'s
        ``ask_before``): the runtime asks, on every backend."""
        return tool in (self.approval_policy.get("ask_before") or [])

    def _changed(self) -> None:
        """A step was added (the server's agent registers its spec again)."""

    def declaration(self) -> dict[str, Any]:
        """The body of ``PUT /api/agents/{name}``."""
        return {
            "input_schema": self.input_schema,
            "retry_policy": self.retry.as_dict(),
            "label": self.label,
            "description": self.description,
            "tools": [  # The server ships its own webhook checks.
                {"name": tool.name, "reversibility": tool.reversibility}
                for tool in self.own_tools()
            ],
            "approval_policy": self.approval_policy,
        }

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, steps={list(self.steps)})"
