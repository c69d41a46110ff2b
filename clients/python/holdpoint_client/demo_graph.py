"""The LangGraph demo of ``make run``: review a tool call (LangGraph's ``HumanInterrupt``),
then post it through the ledger. Imported by ``holdpoint_client.demo`` when langgraph is
installed."""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from holdpoint_client.demo import receiver
from holdpoint_client.langgraph import graph_agent, side_effect


class State(TypedDict, total=False):
    topic: str
    tool_call: dict[str, Any]
    review: str
    outcome: Any


def draft(state: State) -> State:
    text = f"Release notes for {state['topic']} are ready."
    return {"tool_call": {"action": "announce", "args": {"text": text}}}


def human_review(state: State) -> State:
    call = state["tool_call"]
    [response] = interrupt(
        [
            {
                "action_request": call,
                "config": {
                    "allow_accept": True,
                    "allow_edit": True,
                    "allow_respond": True,
                    "allow_ignore": True,
                },
                "description": f"Announce: {call['args']['text']}",
            }
        ]
    )
    if response["type"] == "edit":
        return {"review": "edit", "tool_call": response["args"]}
    if response["type"] == "response":
        return {"review": "response", "outcome": response["args"]}
    return {"review": response["type"]}


def announce(state: State) -> State:
    body = state["tool_call"]["args"]
    sent = side_effect(
        "webhook", "announcements", {"url": receiver() + "/hooks/announce", "body": body}
    )
    return {"outcome": sent.external_reference}


builder = StateGraph(State)
builder.add_node("draft", draft)
builder.add_node("human_review", human_review)
builder.add_node("announce", announce)
builder.add_edge(START, "draft")
builder.add_edge("draft", "human_review")
builder.add_conditional_edges(
    "human_review",
    lambda s: "announce" if s["review"] in ("accept", "edit") else END,
    ["announce", END],
)
builder.add_edge("announce", END)
review = graph_agent(
    "remote-review",
    builder,
    input_schema={"topic": "string"},
    label="Review {topic}",
    description="Remote agent (LangGraph): review a tool call, then announce it once",
)
