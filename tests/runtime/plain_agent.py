"""An agent written only against the client package (``holdpoint_client``: no Django, no
``runtime.sdk``). The same object runs in the server's process (``runagents`` with
``HOLDPOINT_AGENT_MODULES=tests.runtime.plain_agent``), as a remote worker
(``holdpoint-worker tests.runtime.plain_agent:agent``) and in memory
(``holdpoint_client.testing.run_agent``): how it is started decides, not its code
(tests/runtime/test_plain_agent.py, tests/clients/test_plain_agent.py)."""

from __future__ import annotations

from typing import Any

from holdpoint_client import Agent, Context, Done, Next, Outcome, RetryPolicy, ToolResult


class TicketTool:
    """A tool of the agent's own: tickets kept in memory by idempotency key."""

    name = "plain-ticket"
    reversibility = "compensable"

    def __init__(self) -> None:
        self.tickets: dict[str, str] = {}
        self.executed = 0

    def execute(self, request: dict[str, Any], idempotency_key: str) -> ToolResult:
        self.executed += 1
        reference = self.tickets.setdefault(idempotency_key, f"T-{len(self.tickets) + 1}")
        return ToolResult(external_reference=reference, result={"versions": request["versions"]})

    def lookup(self, idempotency_key: str) -> Outcome | None:
        reference = self.tickets.get(idempotency_key)
        return None if reference is None else Outcome("confirmed", external_reference=reference)


tickets = TicketTool()

agent = Agent(
    name="plain-deploy",
    input_schema={"service": "string"},
    label="Deploy {service}",
    tools=[tickets],
    retry=RetryPolicy(max_attempts=2, backoff_initial=0.0, jitter=0.0),
    approval_policy={"ask_before": ["plain-ticket"]},  # every ticket asks a person first
)


@agent.step(start=True)
def plan(ctx: Context, state: dict[str, Any]) -> Next:
    answer = ctx.ask("Which versions?", {"versions": "string[]"})
    ctx.log("planned", versions=answer["versions"])
    return ctx.next("apply", {"versions": answer["versions"]})


@agent.step
def apply(ctx: Context, state: dict[str, Any]) -> Done:
    done = ctx.side_effect("plain-ticket", ctx.input["service"], {"versions": state["versions"]})
    return ctx.done({"ticket": done.external_reference, "versions": done.result["versions"]})
