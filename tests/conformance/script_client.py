"""The Python script agent on the HTTP worker protocol (``holdpoint-worker
tests.conformance.script_client:agent``): the steps of ``script.py`` in a
``holdpoint_client.Agent`` with the folder tool running in the worker's process."""

from __future__ import annotations

from typing import Any

from holdpoint_client import Agent, Outcome, RetryPolicy, ToolResult

from tests.conformance.script import STEPS, TOOL, Folder, step_function

POLICY = RetryPolicy(max_attempts=2, backoff_initial=0.1, backoff_max=0.2, max_lease_losses=3)


class FolderTool:
    name = TOOL
    reversibility = "reversible"

    def __init__(self) -> None:
        self.folder = Folder()

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        reference, result = self.folder.act(request, idempotency_key)
        return ToolResult(external_reference=reference, result=result)

    def lookup(self, idempotency_key: str) -> Outcome | None:
        reference = self.folder.look(idempotency_key)
        return None if reference is None else Outcome("confirmed", reference, {"written": True})


agent = Agent(
    name="conf-python",
    description="The conformance script agent (conformance/scenarios)",
    tools=[FolderTool()],
    retry=POLICY,
)
for _name in STEPS:
    agent.step(_name)(step_function(_name))
