"""``Agent`` as the server knows it (``runtime/sdk.py`` exports it): the agent SDK's one
agent class (``holdpoint_client/agent.py``), registered with the runtime and the run store
when it is created, with the server's checks of its label and approval policy.

Creating one registers it with ``runtime/registry.py``, which knows agents by the SDK's
class alone (a plain ``holdpoint_client.Agent`` is registered there too), so the registry
imports nothing of this module. Nothing here needs Django configured: an agent module
imports it the same in a test without a server.
"""

from __future__ import annotations

from typing import Any

from holdpoint_client.agent import Agent as SdkAgent
from holdpoint_client.agent import StepFunction, StepOptions

from runs.agents import AgentSpec, RetryPolicy
from runtime import registry

__all__ = ["Agent", "StepFunction", "StepOptions"]


class Agent(SdkAgent):
    """An agent: its name, input schema, retry policy and steps.

    Creating one registers it with the runtime (so workers can run it) and with the
    run store (so ``run_start`` accepts it). A plain ``holdpoint_client.Agent`` in an agent
    module is registered the same when its module is loaded (``registry.adopt``).
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

        ``tools``: the names of the server's tools the agent calls.

        ``approval_policy``: who may approve its approvals and how many must
        (docs/agents.md, approval policies); checked now, a mistake is a ``ValueError``."""
        self._registered = False
        super().__init__(
            name=name,
            input_schema=input_schema,
            retry=retry,
            description=description,
            tools=tools,
            label=label,
            approval_policy=approval_policy,
        )
        self.approval_policy = registry.checked_policy(self.approval_policy)
        registry.register(self)
        self._registered = True

    @property
    def spec(self) -> AgentSpec:
        return registry.agent_spec(self)

    def _changed(self) -> None:
        if self._registered and any(o.retry is not None for o in self.step_options.values()):
            # The run store judges failures by the spec: register it again with this step's.
            registry.register(self)

    def unregister(self) -> None:
        registry.unregister(self.name)
