"""LangGraph graphs of plain Python nodes (no model, no network), run by Holdpoint through
``holdpoint_client.langgraph``: LangGraph's human-in-the-loop examples (review a tool
call: accept, edit, respond, ignore; ask the human), a graph to kill between nodes and a
graph that loops in slow nodes, to cancel and to pause.

Each node appends its name and pid to ``nodes.log`` in ``HOLDPOINT_TEST_TOOL_DIR``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

from holdpoint_client import RetryPolicy
from holdpoint_client.langgraph import current_context, graph_agent, side_effect
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from tests.clients.agents import FolderTool


def visit(node: str) -> None:
    root = Path(os.environ["HOLDPOINT_TEST_TOOL_DIR"])
    with (root / "nodes.log").open("a") as log:
        log.write(f"{node} {os.getpid()}\n")


class ReviewState(TypedDict, total=False):
    request: str
    tool_call: dict[str, Any]
    review: str
    outcome: Any


def call_llm(state: ReviewState) -> ReviewState:
    visit("call_llm")
    return {"tool_call": {"name": "folder", "args": {"city": "sf", "note": state["request"]}}}


def human_review(state: ReviewState) -> ReviewState:
    return _review(state, edit=True, respond=True)


def strict_review(state: ReviewState) -> ReviewState:
    """The Agent Inbox's accept-or-ignore review: no edits, no free-text response."""
    return _review(state, edit=False, respond=False)


def _review(state: ReviewState, *, edit: bool, respond: bool) -> ReviewState:
    visit("human_review")
    call = state["tool_call"]
    [response] = interrupt(
        [
            {
                "action_request": {"action": call["name"], "args": call["args"]},
                "config": {
                    "allow_accept": True,
                    "allow_edit": edit,
                    "allow_respond": respond,
                    "allow_ignore": True,
                },
                "description": f"Run {call['name']} with {call['args']}?",
            }
        ]
    )
    if response["type"] == "accept":
        return {"review": "accepted"}
    if response["type"] == "edit":
        return {"review": "edited", "tool_call": {"name": call["name"], **response["args"]}}
    if response["type"] == "response":
        return {"review": "responded", "outcome": response["args"]}
    return {"review": "ignored"}


def route(state: ReviewState) -> str:
    return "run_tool" if state["review"] in ("accepted", "edited") else END


def run_tool(state: ReviewState) -> ReviewState:
    visit("run_tool")
    call = state["tool_call"]
    done = side_effect("folder", call["args"]["city"], call["args"])
    return {"outcome": done.external_reference}


def review_graph(name: str, review_node: Any) -> Any:
    builder = StateGraph(ReviewState)
    builder.add_node("call_llm", call_llm)
    builder.add_node("human_review", review_node)
    builder.add_node("run_tool", run_tool)
    builder.add_edge(START, "call_llm")
    builder.add_edge("call_llm", "human_review")
    builder.add_conditional_edges("human_review", route, ["run_tool", END])
    builder.add_edge("run_tool", END)
    return graph_agent(
        name,
        builder,
        input_schema={"request": "string"},
        tools=[FolderTool()],
        retry=RetryPolicy(backoff_initial=0.1, backoff_max=0.5),
    )


review = review_graph("lg-review", human_review)
strict = review_graph("lg-strict-review", strict_review)


class AskState(TypedDict, total=False):
    greeting: str
    location: str


def ask_human(state: AskState) -> AskState:
    visit("ask_human")
    return {"location": interrupt("Where are you?")}


def answer(state: AskState) -> AskState:
    visit("answer")
    return {"greeting": f"Weather in {state['location']}: sunny"}


ask_builder = StateGraph(AskState)
ask_builder.add_node("ask_human", ask_human)
ask_builder.add_node("answer", answer)
ask_builder.add_edge(START, "ask_human")
ask_builder.add_edge("ask_human", "answer")
ask_builder.add_edge("answer", END)
ask = graph_agent("lg-ask", ask_builder)


class ChainState(TypedDict, total=False):
    written: str
    slept: bool
    done: bool


def write(state: ChainState) -> ChainState:
    visit("write")
    done = side_effect("folder", "chain", {"step": "write"})
    return {"written": done.external_reference}


def linger(state: ChainState) -> ChainState:
    visit("linger")
    if os.environ.get("HOLDPOINT_TEST_LINGER"):
        current_context().sleep(float(os.environ["HOLDPOINT_TEST_LINGER"]))  # Killed here.
    return {"slept": True}


def finish(state: ChainState) -> ChainState:
    visit("finish")
    return {"done": True}


chain_builder = StateGraph(ChainState)
for name, node in (("write", write), ("linger", linger), ("finish", finish)):
    chain_builder.add_node(name, node)
chain_builder.add_edge(START, "write")
chain_builder.add_edge("write", "linger")
chain_builder.add_edge("linger", "finish")
chain_builder.add_edge("finish", END)
chain = graph_agent(
    "lg-chain",
    chain_builder,
    tools=[FolderTool()],
    retry=RetryPolicy(backoff_initial=0.1, backoff_max=0.5),
)


class LoopState(TypedDict, total=False):
    steps: int
    pause: float
    hold_at: int
    n: int


def tick(state: LoopState) -> LoopState:
    """One slow node with one tool call; the graph loops back to it ``steps`` times. The
    tick numbered ``hold_at`` (if any) sleeps a minute, for a cancel to land in."""
    n = int(state.get("n", 0))
    visit("tick")
    pause = 60.0 if n == state.get("hold_at") else float(state.get("pause", 0.2))
    current_context().sleep(pause)  # Wakes and unwinds at once on a cancel.
    side_effect("folder", f"tick{n}", {"n": n})
    return {"n": n + 1}


def again(state: LoopState) -> str:
    return "tick" if state["n"] < int(state.get("steps", 1000)) else END


loop_builder = StateGraph(LoopState)
loop_builder.add_node("tick", tick)
loop_builder.add_edge(START, "tick")
loop_builder.add_conditional_edges("tick", again, ["tick", END])
loop = graph_agent(
    "lg-loop",
    loop_builder,
    input_schema={"steps": "integer", "pause": "number", "hold_at": "integer?"},
    tools=[FolderTool()],
    retry=RetryPolicy(backoff_initial=0.1, backoff_max=0.5),
)

AGENTS = [review, strict, ask, chain, loop]
