"""OpenAI Agents SDK agents on a scripted model (no provider, no network), run by Holdpoint
through ``holdpoint_client.openai_agents``: the SDK's human-in-the-loop example (a tool
with ``needs_approval``: approve, edit, send back, deny) and a chain of turns to kill
between turns.

The model answers from the conversation so far (how many tool outputs it holds), so a
worker that runs a turn again gets the same answer. Each model call and each tool call
appends a line (``model <turn> <pid>``, ``<tool> <pid>``) to ``nodes.log`` in
``HOLDPOINT_TEST_TOOL_DIR``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, function_tool
from agents.testing import assistant_message, function_call
from holdpoint_client import RetryPolicy
from holdpoint_client.openai_agents import (
    current_context,
    openai_agent,
    scripted_model,
    side_effect,
)

from tests.clients.agents import FolderTool

NO_NETWORK = RunConfig(tracing_disabled=True)
RETRY = RetryPolicy(backoff_initial=0.1, backoff_max=0.5)


def visit(what: str) -> None:
    root = Path(os.environ["HOLDPOINT_TEST_TOOL_DIR"])
    with (root / "nodes.log").open("a") as log:
        log.write(f"{what} {os.getpid()}\n")


def outputs(items: list[Any]) -> list[str]:
    """The tool outputs the model has been given so far, in order."""
    return [
        str(item.get("output"))
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


# --- Review a tool call: the SDK's needs_approval ---------------------------------------------


@function_tool
def forecast(city: str) -> str:
    """The weather in a city (a read: no approval, no ledger)."""
    visit("forecast")
    return f"sunny in {city}"


@function_tool(needs_approval=True)
def write_note(city: str, note: str) -> str:
    """Write a note about a city into the folder (needs a person's approval; through the
    ledger)."""
    visit("write_note")
    done = side_effect("folder", city, {"city": city, "note": note})
    return f"written {done.external_reference} for {city}: {note}"


def review_turns(items: list[Any]) -> list[Any]:
    seen = outputs(items)
    visit(f"model{len(seen)}")
    if not seen:
        return [function_call("forecast", {"city": "sf"}, call_id="call_forecast")]
    if len(seen) == 1:
        request = next(
            (i.get("content") for i in items if isinstance(i, dict) and i.get("role") == "user"),
            "",
        )
        return [
            function_call(
                "write_note", {"city": "sf", "note": str(request)}, call_id="call_write_note"
            )
        ]
    return [assistant_message(f"Done: {seen[-1]}")]


review = openai_agent(
    "oa-review",
    Agent(
        name="note-writer",
        instructions="Check the weather, then write a note.",
        tools=[forecast, write_note],
        model=scripted_model(review_turns),
    ),
    input_schema={"input": "string"},
    tools=[FolderTool()],
    retry=RETRY,
    run_config=NO_NETWORK,
)


# --- A chain of turns to kill between turns ----------------------------------------------------


@function_tool
def write(step: str) -> str:
    """Write through the ledger (the tool call that must not be made twice)."""
    visit("write")
    return side_effect("folder", "chain", {"step": step}).external_reference


@function_tool
def linger(seconds: float) -> str:
    """Sleep inside a turn (a worker is killed here) when the test asks for it."""
    visit("linger")
    if os.environ.get("HOLDPOINT_TEST_LINGER"):
        current_context().sleep(float(os.environ["HOLDPOINT_TEST_LINGER"]))
    return "slept"


def chain_turns(items: list[Any]) -> list[Any]:
    seen = outputs(items)
    visit(f"model{len(seen)}")
    if not seen:
        return [function_call("write", {"step": "first"}, call_id="call_write")]
    if len(seen) == 1:
        return [function_call("linger", {"seconds": 1}, call_id="call_linger")]
    return [assistant_message(f"Done after {len(seen)} tool calls")]


chain = openai_agent(
    "oa-chain",
    Agent(
        name="chain",
        instructions="Write, then wait.",
        tools=[write, linger],
        model=scripted_model(chain_turns),
    ),
    tools=[FolderTool()],
    retry=RETRY,
    run_config=NO_NETWORK,
)

AGENTS = [review, chain]
