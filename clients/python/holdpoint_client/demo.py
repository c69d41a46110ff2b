"""The remote demo agents ``make run`` starts beside the in-process ones (run them against
any server: ``holdpoint-worker --url … --token … holdpoint_client.demo:AGENTS``).

``remote-triage`` (the Python client) asks which team takes a ticket, asks approval to
notify it, and posts the notification through the ledger to ``HOLDPOINT_DEMO_RECEIVER``
(the demo webhook receiver of ``make run``); ``remote-review`` (a LangGraph graph, when
``langgraph`` is installed) reviews a tool call in the Agent Inbox's shape;
``remote-status`` (an OpenAI Agents SDK agent, when ``openai-agents`` is installed) posts a
status update through a tool with ``needs_approval``.
"""

from __future__ import annotations

import os
from typing import Any

from holdpoint_client.agent import Agent
from holdpoint_client.context import Context
from holdpoint_client.tools import WebhookTool
from holdpoint_client.types import Done, Next, RetryPolicy


def receiver() -> str:
    return os.environ.get("HOLDPOINT_DEMO_RECEIVER", "http://127.0.0.1:8765").rstrip("/")


triage = Agent(
    name="remote-triage",
    input_schema={"ticket": "string"},
    label="Triage {ticket}",
    description="Remote agent (Python client): route a ticket, notify the team once",
    tools=[WebhookTool(lookup_url=receiver() + "/deliveries/{idempotency_key}")],
    retry=RetryPolicy(max_attempts=3, backoff_initial=1),
)


@triage.step(start=True)
def route(ctx: Context, state: dict[str, Any]) -> Next:
    team = ctx.ask(
        f"Which team should take {ctx.input['ticket']}?",
        {"team": "string"},
        context={"ticket": ctx.input["ticket"]},
    )
    ctx.log("routed", team=team["team"])
    return ctx.next("notify", {"team": team["team"]})


@triage.step
def notify(ctx: Context, state: dict[str, Any]) -> Done:
    body = {"ticket": ctx.input["ticket"], "team": state["team"]}
    sent = ctx.side_effect(
        "webhook", f"{state['team']} channel", {"url": receiver() + "/hooks/triage", "body": body}
    )
    return ctx.done({"team": state["team"], "delivery": sent.external_reference})


AGENTS: list[Agent] = [triage]

try:  # The LangGraph demo needs the [langgraph] extra.
    from holdpoint_client.demo_graph import review
except ImportError:  # pragma: no cover - without langgraph
    pass
else:
    AGENTS.append(review)

try:  # The OpenAI Agents SDK demo needs the [openai-agents] extra.
    from holdpoint_client.demo_openai_agents import status
except ImportError:  # pragma: no cover - without openai-agents
    pass
else:
    AGENTS.append(status)
