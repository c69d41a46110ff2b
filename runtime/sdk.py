"""The agent SDK: what an agent author writes against.

An agent is a named set of steps. A step is a plain function ``step(ctx, state)``
that returns ``ctx.next("other_step", new_state)`` or ``ctx.done(result)``::

    deploy = Agent(name="deploy", input_schema={"service": "string"})

    @deploy.step("plan", start=True)
    def plan(ctx: Context, state: dict) -> Next | Done:
        versions = ctx.ask("Which versions?", {"versions": "string[]"})
        return ctx.next("apply", {"versions": versions["versions"]})

The runtime saves a checkpoint (the step to run next and its state) at every step
boundary, so a step is the unit of work that is repeated after a crash or a
resume. The rules that follow from that are in the README, "Workers and agents".

Nothing here imports models: agent modules are imported while Django starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

from runs.agents import AgentSpec, RetryPolicy

if TYPE_CHECKING:
    from runtime.context import Context

__all__ = [
    "Agent",
    "Approval",
    "ApprovalDenied",
    "Confirmed",
    "Context",
    "Deterministic",
    "Done",
    "Next",
    "RetryPolicy",
    "SideEffectFailed",
    "StepFunction",
    "Transient",
]


@dataclass(frozen=True)
class Next:
    """Go on with ``step``; the runtime saves ``state`` in a checkpoint first."""

    step: str
    state: Any = field(default_factory=dict)


@dataclass(frozen=True)
class Done:
    """The run succeeded with ``result`` (any JSON value)."""

    result: Any = None


StepFunction = Callable[["Context", Any], "Next | Done"]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Approval:
    """A person's answer to ``ctx.approve``. A denial is a value the agent acts on."""

    approved: bool
    comment: str = ""
    answered_by: str | None = None
    request_id: str = ""
    # Nobody was asked: the planned change was empty (every from equals its to). The step
    # goes on; it usually has nothing to do (the timeline says why).
    unchanged: bool = False

    @property
    def denied(self) -> bool:
        return not self.approved


class StepError(Exception):
    """Base of the errors a step raises to say how its failure should be classified.

    Any other exception is classified by the agent's retry policy: transient,
    unless its type name is in ``non_retryable``.
    """

    failure_class: str | None = None


class Transient(StepError):
    """Worth retrying later (a timeout, a 503): back off and try again while budget lasts."""

    failure_class = "transient"


class Deterministic(StepError):
    """Retrying cannot help until something changes (bad input, a rejected change): stop."""

    failure_class = "deterministic"


class ApprovalDenied(StepError):
    """An irreversible side effect was denied by a person. Catch it to take another path;
    left uncaught, the run fails with class ``denied``."""

    failure_class = "denied"

    def __init__(self, message: str, *, approval: Approval) -> None:
        super().__init__(message)
        self.approval = approval


class SideEffectFailed(StepError):
    """The external system refused the action: it certainly did not happen. Classified by
    the agent's policy (transient unless ``"SideEffectFailed"`` is ``non_retryable``); a
    retry acts again with the same idempotency key."""

    def __init__(self, message: str, *, operation_id: str, error: Any = None) -> None:
        super().__init__(message)
        self.operation_id = operation_id
        self.error = error


@dataclass(frozen=True)
class Confirmed:
    """What ``ctx.side_effect`` returns: the confirmed outcome as the ledger recorded it.

    ``decision`` says how it was reached: ``act`` (done now), ``look_up`` (an earlier
    attempt did it; the external system confirmed) or ``reuse`` (already recorded).
    """

    operation_id: str
    external_reference: str
    result: Any
    decision: str


class CostBudgetExceeded(Deterministic):
    """The run's cost went past the agent's ``cost_budget``."""


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
    ) -> None:
        """``label``: how a run of this agent is named where people read, a template over
        its input (``"Migrate {service}"``); default the agent's name and a short run id."""
        if not name or len(name) > 100:
            raise ValueError("An agent name must be 1 to 100 characters.")
        self.name = name
        self.input_schema = dict(input_schema or {})
        self.retry = retry or RetryPolicy()
        self.description = description
        self.tools = tuple(tools)
        self.label = label
        self.steps: dict[str, StepFunction] = {}
        self.start: str | None = None
        from runtime import registry

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
        from runtime import registry

        registry.unregister(self.name)

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, steps={list(self.steps)})"


def __getattr__(name: str) -> Any:
    # ``from runtime.sdk import Context`` for type hints, without importing the run store
    # while Django is still loading apps.
    if name == "Context":
        from runtime.context import Context

        return Context
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
