"""``Agent``: an agent's name, input schema, retry policy and steps (``runtime/sdk.py`` exports it).

Creating one registers it with ``runtime/registry.py``, which knows agents only by the
small interface it needs, so the registry imports nothing of this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from runs.agents import AgentSpec, RetryPolicy
from runs.approvals import parse_policy
from runtime import registry
from runtime.types import Done, Next

if TYPE_CHECKING:
    from runtime.context import Context

StepFunction = Callable[["Context", Any], "Next | Done"]
F = TypeVar("F", bound=Callable[..., Any])


class Agent:
    """An agent: its name, input schema, retry policy and steps.

    Creating one registers it with the runtime (so workers can run it) and with the
    run store (so ``run_start`` accepts it).
    """

    def __init__(
        self,
        *,
        name: str,
        input_schema: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        description: str = "",
        tools: tuple[str, ...] | list[str] = (),
        label: str = "",
        approval_policy: dict[str, Any] | None = None,
    ) -> None:
        """``label``: how a run of this agent is named where people read, a template over
        its input (``"Migrate {service}"``); default the agent's name and a short run id.
        ``approval_policy``: who may approve its approvals and how many must
        (docs/agents.md, approval policies); checked now, a mistake is a ``ValueError``."""
        if not name or len(name) > 100:
            raise ValueError("An agent name must be 1 to 100 characters.")
        self.name = name
        self.input_schema = dict(input_schema or {})
        self.retry = retry or RetryPolicy()
        self.description = description
        self.tools = tuple(tools)
        self.label = label
        self.approval_policy = parse_policy(approval_policy)
        self.steps: dict[str, StepFunction] = {}
        self.start: str | None = None
        registry.register(self)

    @property
    def spec(self) -> AgentSpec:
        return AgentSpec(
            name=self.name,
            input_schema=self.input_schema,
            retry_policy=self.retry,
            tools=self.tools,
            description=self.description,
            source="python",
            label=self.label,
            approval_policy=self.approval_policy,
        )

    @overload
    def step(self, name: F, *, start: bool = False) -> F: ...

    @overload
    def step(self, name: str | None = None, *, start: bool = False) -> Callable[[F], F]: ...

    def step(self, name: Any = None, *, start: bool = False) -> Any:
        """Register a step: ``@agent.step``, ``@agent.step("name")`` or with ``start=True``.

        The first step registered is where a run starts unless another says ``start=True``.
        """
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

    def unregister(self) -> None:
        registry.unregister(self.name)

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, steps={list(self.steps)})"
