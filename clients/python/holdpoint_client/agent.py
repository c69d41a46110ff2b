"""``Agent``: a name, an input schema, a retry policy, tools and steps, as in ``runtime.sdk``.

Nothing is registered globally: ``holdpoint-worker module:agent`` (or ``Worker``) declares
the agent to the server (``PUT /api/agents/{name}``) and serves it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from holdpoint_client.tools import REVERSIBILITIES, Tool, WebhookTool
from holdpoint_client.types import Done, Next, RetryPolicy

if TYPE_CHECKING:
    from holdpoint_client.context import Context

StepFunction = Callable[["Context", Any], "Next | Done"]
F = TypeVar("F", bound=Callable[..., Any])


class Agent:
    def __init__(
        self,
        *,
        name: str,
        input_schema: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        description: str = "",
        tools: Iterable[Tool | str] = (),
        label: str = "",
        approval_policy: dict[str, Any] | None = None,
    ) -> None:
        """``tools``: tool objects that run in this process (``WebhookTool`` is always
        there), or names of the server's shipped tools. ``approval_policy``:
        ``{"ask_before": [tool names]}``, tools whose every call asks a person first."""
        if not name or len(name) > 100:
            raise ValueError("An agent name must be 1 to 100 characters.")
        self.name = name
        self.input_schema = dict(input_schema or {})
        self.retry = retry or RetryPolicy()
        self.description = description
        self.label = label
        self.approval_policy = dict(approval_policy or {})
        self.tools: dict[str, Tool] = {"webhook": WebhookTool()}
        for tool in tools:
            if isinstance(tool, str):
                continue  # A shipped tool of the server, named only.
            if tool.reversibility not in REVERSIBILITIES:
                raise ValueError(
                    f"tool {tool.name!r}: unknown reversibility {tool.reversibility!r}"
                )
            self.tools[tool.name] = tool
        self.steps: dict[str, StepFunction] = {}
        self.start: str | None = None

    @overload
    def step(self, name: F, *, start: bool = False) -> F: ...

    @overload
    def step(self, name: str | None = None, *, start: bool = False) -> Callable[[F], F]: ...

    def step(self, name: Any = None, *, start: bool = False) -> Any:
        """Register a step: ``@agent.step``, ``@agent.step("name")`` or with ``start=True``."""
        if callable(name):
            return self._add(name.__name__, name, start=start)

        def decorate(func: F) -> F:
            return self._add(name or func.__name__, func, start=start)

        return decorate

    def _add(self, name: str, func: F, *, start: bool) -> F:
        if not name or len(name) > 100:
            raise ValueError("A step name must be 1 to 100 characters.")
        if name in self.steps and self.steps[name] is not func:
            raise ValueError(f"Agent {self.name!r} already has a step named {name!r}.")
        self.steps[name] = func
        if start or self.start is None:
            self.start = name
        return func

    def declaration(self) -> dict[str, Any]:
        """The body of ``PUT /api/agents/{name}``."""
        return {
            "input_schema": self.input_schema,
            "retry_policy": self.retry.as_dict(),
            "label": self.label,
            "description": self.description,
            "tools": [
                {"name": tool.name, "reversibility": tool.reversibility}
                for tool in self.tools.values()
                if tool.name != "webhook"  # The server ships its own webhook checks.
            ],
            "approval_policy": self.approval_policy,
        }

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, steps={list(self.steps)})"
