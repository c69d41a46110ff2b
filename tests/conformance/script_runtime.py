"""The Python script agent in the server's own runtime (``runagents``, ``make run``, the
harness ``runtime.testing.run_agent``): the steps of ``script.py`` in a ``runtime.sdk``
agent, with the folder tool registered with the ledger. Imported by the test process and
by ``runagents`` (``HOLDPOINT_AGENT_MODULES``)."""

from __future__ import annotations

from typing import Any

from ledger.tools import Outcome, ToolResult, register_tool
from runtime.sdk import Agent, RetryPolicy
from tests.conformance.script import STEPS, TOOL, Folder, step_function

POLICY = RetryPolicy(max_attempts=2, backoff_initial=0.1, backoff_max=0.2, max_lease_losses=3)


class FolderTool:
    name = TOOL
    reversibility = "reversible"

    def __init__(self, *, hang: bool = True) -> None:
        self.folder = Folder(hang=hang)

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        reference, result = self.folder.act(request, idempotency_key)
        return ToolResult(external_reference=reference, result=result)

    def lookup(self, idempotency_key: str) -> Outcome | None:
        reference = self.folder.look(idempotency_key)
        return None if reference is None else Outcome("confirmed", reference, {"written": True})


register_tool(FolderTool())

agent = Agent(
    name="conf-inprocess",
    description="The conformance script agent (conformance/scenarios)",
    tools=[TOOL],
    retry=POLICY,
)
for _name in STEPS:
    agent.step(_name)(step_function(_name))
