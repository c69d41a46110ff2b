"""The OpenAI Agents SDK demo of ``make run``: an SDK agent on a scripted model (no
provider, no network) looks an incident up, then posts a status update through a tool with
``needs_approval`` (an approval card in the inbox: approve, edit, send back or deny), which
goes through the ledger. Imported by ``holdpoint_client.demo`` when openai-agents is
installed."""

from __future__ import annotations

import json
from typing import Any

from agents import Agent, RunConfig, function_tool
from agents.testing import assistant_message, function_call

from holdpoint_client.agent import Agent as HoldpointAgent
from holdpoint_client.demo import receiver
from holdpoint_client.openai_agents import openai_agent, scripted_model, side_effect
from holdpoint_client.tools import WebhookTool
from holdpoint_client.types import RetryPolicy


@function_tool
def incident_summary(incident: str) -> str:
    """What is known of an incident (a read: no approval)."""
    return f"{incident}: error rate back to normal since the rollback."


@function_tool(needs_approval=True)
def post_status(channel: str, text: str) -> str:
    """Post a status update to a channel (a person approves it; sent once, through the
    ledger)."""
    sent = side_effect(
        "status-page",
        channel,
        {"url": receiver() + "/hooks/status", "body": {"channel": channel, "text": text}},
    )
    return f"Posted to {channel} ({sent.external_reference})."


def _incident(items: list[Any]) -> str:
    for item in items:
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            try:
                found = json.loads(content) if isinstance(content, str) else {}
            except ValueError:
                return str(content)
            return str(found.get("incident", content)) if isinstance(found, dict) else str(found)
    return "the incident"


def respond(items: list[Any]) -> list[Any]:
    """The model's turns, decided by the tool outputs it has read so far."""
    outputs = [
        str(i.get("output"))
        for i in items
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]
    incident = _incident(items)
    if not outputs:
        return [function_call("incident_summary", {"incident": incident}, call_id="call_summary")]
    if len(outputs) == 1:
        text = f"Resolved: {outputs[0]}"
        return [
            function_call(
                "post_status", {"channel": "#status", "text": text}, call_id="call_post_status"
            )
        ]
    return [assistant_message(f"Status update for {incident}: {outputs[-1]}")]


status = openai_agent(
    "remote-status",
    Agent(
        name="status-writer",
        instructions="Summarise the incident, then post a status update.",
        tools=[incident_summary, post_status],
        model=scripted_model(respond),
    ),
    input_schema={"incident": "string"},
    label="Status of {incident}",
    description="Remote agent (OpenAI Agents SDK): post a status update once it is approved",
    # A status post can be retracted (the demo receiver's /retract): compensable, so the
    # approval of post_status is the one question; sent once, looked up after a crash.
    tools=[
        WebhookTool(
            name="status-page",
            lookup_url=receiver() + "/deliveries/{idempotency_key}",
            reversibility="compensable",
        )
    ],
    retry=RetryPolicy(max_attempts=3, backoff_initial=1),
    run_config=RunConfig(tracing_disabled=True),
)

AGENTS: list[HoldpointAgent] = [status]
