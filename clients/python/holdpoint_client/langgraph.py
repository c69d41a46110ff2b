"""Run a LangGraph graph as a Holdpoint agent (``pip install "holdpoint-client[langgraph]"``).

``graph_agent(name, builder)`` turns a ``StateGraph`` (not compiled) into an ``Agent``
whose steps are the graph's nodes:

- **Each node boundary is a Holdpoint checkpoint.** One Holdpoint step runs one LangGraph
  superstep (the node the graph goes to next), then saves the graph's state, the node
  that wrote it and the nodes due next as the checkpoint. A worker killed between nodes
  resumes from the last boundary: nodes before it never run again. The graph runs on a
  fresh in-memory LangGraph checkpointer each time, restored from Holdpoint's checkpoint
  with ``update_state(values, as_node=…)``; Holdpoint is the durable store.
- **``interrupt(payload)`` inside a node is a hold point**: the card shows the payload;
  the person's answer resumes the node with ``Command(resume=…)`` (LangGraph re-runs the
  node from its start, as it always does on resume). Such a node runs three times per
  question: up to the interrupt in the attempt that asks; up to it again in the attempt
  after the answer, so that the payload it asks with *now* is checked against the answer
  (an approval covers exactly the call it showed, and LangGraph cannot show a payload
  without running the node); and from its start once more when LangGraph resumes it. LangGraph's ``HumanInterrupt``
  (``{action_request, config, description}``, Agent Inbox) becomes an **approval** hold
  point (``auth_required``): the approval card shows the action and its arguments
  (editable in the card's form when ``allow_edit``), and the approver approves, approves
  with edits, sends it back with a comment, or denies. The decision goes back as the
  ``HumanResponse``: approve → ``accept``, approve with edits → ``edit`` (the edited
  arguments), send back → ``response`` (the comment), deny → ``ignore``. A send-back the
  ``config`` does not allow (``allow_respond`` false) is handed back as ``ignore``; an
  approval when only edits are allowed is an ``edit`` with the arguments as planned.
  Any other payload is a question: a string is the prompt; a dict may carry ``prompt``
  (or ``question``) and a ``schema``.
- **Side effects**: a node calls ``side_effect(tool, target, request)`` (this module) for
  a tool call that acts on the world: it goes through the ledger like ``ctx.side_effect``
  (exactly once across re-runs and crashes; irreversible tools ask for approval first).

Limits: the graph's state must be JSON (plain dicts, lists, strings, numbers); a
superstep must run one node (parallel branches are refused, ``Deterministic``); the
graph is compiled here (pass the builder, not a compiled graph).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from holdpoint_client.adapters import args_schema, current_context, side_effect, step
from holdpoint_client.agent import Agent
from holdpoint_client.context import Context
from holdpoint_client.tools import Tool
from holdpoint_client.types import Deterministic, Done, Next, RetryPolicy

# Shared with holdpoint_client.openai_agents (holdpoint_client/adapters.py).
__all__ = ["args_schema", "current_context", "graph_agent", "side_effect"]

START_STEP = "__start__"


# --- Interrupts ------------------------------------------------------------------------------

DECISIONS = {"accept": "approve", "edit": "edit", "response": "respond", "ignore": "deny"}
ALLOWS = {
    "accept": "allow_accept",
    "edit": "allow_edit",
    "response": "allow_respond",
    "ignore": "allow_ignore",
}


def _human_interrupt(payload: Any) -> tuple[dict[str, Any], bool] | None:
    """The ``HumanInterrupt`` in ``payload`` and whether it came in a list, or None."""
    if isinstance(payload, list) and len(payload) == 1 and isinstance(payload[0], dict):
        found = payload[0]
        listed = True
    elif isinstance(payload, dict):
        found, listed = payload, False
    else:
        return None
    if isinstance(found.get("action_request"), dict) and isinstance(found.get("config"), dict):
        return found, listed
    return None


def _review(ctx: Context, request: dict[str, Any], key: str) -> dict[str, Any]:
    """A ``HumanInterrupt`` as an approval hold point; its answer as a ``HumanResponse``."""
    action = request["action_request"]
    config = request["config"]
    allowed = [t for t in DECISIONS if config.get(ALLOWS[t], t != "edit")] or ["accept", "ignore"]
    name = str(action.get("action") or "action")[:100]
    args = action.get("args")
    args = args if isinstance(args, dict) else {}
    prompt = str(request.get("description") or f"Approve {name}?")[:10_000]
    approval = ctx.approve(
        name,
        "",
        args,
        # The agent's tool of that name, if any, says how far the call can be undone.
        tool=name,
        prompt=prompt,
        context={"allowed": [DECISIONS[t] for t in allowed]},
        key=key,
        # The arguments are editable on the card when the interrupt allows edits.
        editable=args_schema(args) if "edit" in allowed else None,
        arguments=args,
    )
    if approval.approved:
        if approval.edited is not None and "edit" in allowed:
            return {"type": "edit", "args": {"action": name, "args": approval.edited}}
        if "accept" in allowed or "edit" not in allowed:
            return {"type": "accept", "args": None}
        # Only edits are allowed: approving the plan as it is edits nothing.
        return {"type": "edit", "args": {"action": name, "args": args}}
    if approval.responded and "response" in allowed:
        return {"type": "response", "args": approval.comment}
    return {"type": "ignore", "args": None}


def _ask(ctx: Context, payload: Any, key: str) -> Any:
    """Hold the run at a hold point for ``payload``; return the value to resume with."""
    human = _human_interrupt(payload)
    if human is not None:
        request, listed = human
        response = _review(ctx, request, key)
        return [response] if listed else response
    if isinstance(payload, dict) and ("prompt" in payload or "question" in payload):
        prompt = str(payload.get("prompt") or payload.get("question"))
        if isinstance(payload.get("schema"), dict):
            return ctx.ask(prompt, payload["schema"], context={"interrupt": payload}, key=key)
        return ctx.ask(prompt, {"answer": "string"}, context={"interrupt": payload}, key=key)[
            "answer"
        ]
    prompt = payload if isinstance(payload, str) else json.dumps(payload, default=str)[:2000]
    return ctx.ask(prompt, {"answer": "string"}, context={"interrupt": payload}, key=key)["answer"]


# --- The agent ---------------------------------------------------------------------------------


def graph_agent(
    name: str,
    builder: Any,
    *,
    input_schema: dict[str, Any] | None = None,
    tools: Iterable[Tool | str] = (),
    retry: RetryPolicy | None = None,
    description: str = "",
    label: str = "",
    approval_policy: dict[str, Any] | None = None,
) -> Agent:
    """An ``Agent`` that runs the graph of ``builder`` (a ``StateGraph``), one node per step."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    agent = Agent(
        name=name,
        input_schema=input_schema,
        retry=retry,
        description=description or f"LangGraph graph {name}",
        tools=tools,
        label=label,
        approval_policy=approval_policy,
    )
    nodes = [n for n in builder.nodes if n != START_STEP]

    def superstep(ctx: Context, state: dict[str, Any]) -> Next | Done:
        graph = builder.compile(checkpointer=InMemorySaver(), interrupt_after=nodes)
        config = {"configurable": {"thread_id": ctx.run_id}}
        number = int(state.get("n", 0)) + 1
        if "values" in state:
            graph.update_state(config, state["values"], as_node=state["as_node"])
            first: Any = None
        else:
            first = ctx.input
        ran: list[str] = []
        with step(ctx, number):
            payload: Any = first
            asked = 0
            while True:
                interrupts: list[Any] = []
                for update in graph.stream(payload, config, stream_mode="updates"):
                    for node, _ in update.items():
                        if node == "__interrupt__":
                            interrupts.extend(update[node])
                        elif node not in ran:
                            ran.append(node)
                if not interrupts:
                    break
                # One hold point per interrupt, in order; the answers resume the node.
                values = []
                for interrupt in interrupts:
                    asked += 1
                    values.append(_ask(ctx, interrupt.value, f"interrupt{asked}"))
                if len(interrupts) == 1:
                    payload = Command(resume=values[0])
                else:
                    payload = Command(
                        resume={i.id: v for i, v in zip(interrupts, values, strict=True)}
                    )
        snapshot = graph.get_state(config)
        values = json.loads(json.dumps(snapshot.values))
        if not snapshot.next:
            return ctx.done(values)
        if len(ran) != 1:
            raise Deterministic(
                f"Superstep {number} ran {len(ran)} nodes ({', '.join(ran)}); Holdpoint runs "
                "graphs whose supersteps run one node each."
            )
        following = [n for n in snapshot.next if n in agent.steps]
        if len(following) != 1:
            raise Deterministic(f"After {ran[0]} the graph goes to {list(snapshot.next)}.")
        return ctx.next(following[0], {"values": values, "as_node": ran[0], "n": number})

    agent.step(START_STEP, start=True)(superstep)
    for node in nodes:
        agent.step(node)(superstep)
    return agent
