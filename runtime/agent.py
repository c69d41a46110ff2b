"""``Agent``: an agent's name, input schema, retry policy and steps (``runtime/sdk.py`` exports it).

Creating one registers it with ``runtime/registry.py``, which knows agents only by the
small interface it needs, so the registry imports nothing of this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

from runs.agents import AgentSpec, RetryPolicy
from runs.approvals import parse_policy
from runtime import registry
from runtime.typed import is_typed, schema_of
from runtime.types import Done, Next

if TYPE_CHECKING:
    from runtime.context import Context

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
    """An agent: its name, input schema, retry policy and steps.

    Creating one registers it with the runtime (so workers can run it) and with the
    run store (so ``run_start`` accepts it).
    """

    def __init__(
        self,
        *,
        name: str,
        input_schema: dict[str, Any] | type | None = None,
        retry: RetryPolicy | None = None,
        description: str = "",
        tools: tuple[str, ...] | list[str] = (),
        label: str = "",
        approval_policy: dict[str, Any] | None = None,
    ) -> None:
        """``label``: how a run of this agent is named where people read, a template over
        its input (``"Migrate {service}"``); default the agent's name and a short run id.

        ``input_schema``: JSON Schema (or the compact form), or a Pydantic model or a
        dataclass (``runtime/typed.py``): its JSON Schema is what runs are checked against,
        and ``ctx.input`` is then an instance of it.

        ``approval_policy``: who may approve its approvals and how many must
        (docs/agents.md, approval policies); checked now, a mistake is a ``ValueError``."""
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
        self.retry = retry or RetryPolicy()
        self.description = description
        self.tools = tuple(tools)
        self.label = label
        self.approval_policy = parse_policy(approval_policy)
        self.steps: dict[str, StepFunction] = {}
        self.step_options: dict[str, StepOptions] = {}
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
            step_retry={
                name: options.retry
                for name, options in self.step_options.items()
                if options.retry is not None
            },
            approval_policy=self.approval_policy,
        )

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
        if options.retry is not None:
            # The run store judges failures by the spec: register it again with this step's.
            registry.register(self)
        return func

    def unregister(self) -> None:
        registry.unregister(self.name)

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, steps={list(self.steps)})"
