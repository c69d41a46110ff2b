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
  node from its start, as it always does on resume). LangGraph's ``HumanInterrupt``
  (``{action_request, config, description}``, Agent Inbox) becomes a decision of
  approve / edit / respond / deny (as its ``config`` allows) that is handed back as
  ``HumanResponse`` accept / edit / response / ignore. Any other payload is a question:
  a string is the prompt; a dict may carry ``prompt`` (or ``question``) and a ``schema``.
- **Side effects**: a node calls ``side_effect(tool, target, request)`` (this module) for
  a tool call that acts on the world: it goes through the ledger like ``ctx.side_effect``
  (exactly once across re-runs and crashes; irreversible tools ask for approval first).

Limits: the graph's state must be JSON (plain dicts, lists, strings, numbers); a
superstep must run one node (parallel branches are refused, ``Deterministic``); the
graph is compiled here (pass the builder, not a compiled graph).
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Iterable
from typing import Any

from holdpoint_client.agent import Agent
from holdpoint_client.context import Context
from holdpoint_client.tools import Tool
from holdpoint_client.types import Confirmed, Deterministic, Done, Next, RetryPolicy

START_STEP = "__start__"
_current: contextvars.ContextVar[_Superstep | None] = contextvars.ContextVar(
    "holdpoint_langgraph_superstep", default=None
)


class _Superstep:
    """The Holdpoint side of one superstep: its ctx, its number, its call counters."""

    def __init__(self, ctx: Context, number: int) -> None:
        self.ctx = ctx
        self.number = number
        self.counts: dict[str, int] = {}

    def key(self, kind: str) -> str:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        n = self.counts[kind]
        return f"s{self.number}.{kind}" if n == 1 else f"s{self.number}.{kind}#{n}"


def current_context() -> Context:
    """The Holdpoint ``ctx`` of the node running now (log, cost, observe from a node)."""
    step = _current.get()
    if step is None:
        raise RuntimeError("Not inside a node of a graph run by holdpoint_client.langgraph.")
    return step.ctx


def side_effect(
    tool: str,
    target: str,
    request: dict[str, Any],
    *,
    compensate: dict[str, Any] | None = None,
    reversibility: str | None = None,
    key: str | None = None,
) -> Confirmed:
    """A tool call that acts on the world, from inside a node, through the ledger.

    Its key is the superstep's number and the call's order in the node (or ``key``), so
    the node re-run after a resume or a crash finds the same record and never acts twice.
    """
    step = _current.get()
    if step is None:
        raise RuntimeError("side_effect is called from a node of a graph run by Holdpoint.")
    return step.ctx.side_effect(
        tool,
        target,
        request,
        compensate=compensate,
        reversibility=reversibility,
        key=key or step.key(tool),
    )


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


def _ask(ctx: Context, payload: Any, key: str) -> Any:
    """Hold the run at a hold point for ``payload``; return the value to resume with."""
    human = _human_interrupt(payload)
    if human is not None:
        request, listed = human
        action = request["action_request"]
        config = request["config"]
        allowed = [DECISIONS[t] for t in DECISIONS if config.get(ALLOWS[t], t != "edit")]
        if not allowed:
            allowed = ["approve", "deny"]
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {"decision": {"type": "string", "enum": allowed, "title": "Decision"}},
            "required": ["decision"],
        }
        if "edit" in allowed:
            schema["properties"]["args"] = {"type": "object", "title": "Edited arguments"}
        if "respond" in allowed:
            schema["properties"]["response"] = {"type": "string", "title": "Response"}
        prompt = str(
            request.get("description") or f"Approve {action.get('action', 'this action')}?"
        )[:10_000]
        answer = ctx.ask(
            prompt,
            schema,
            context={"action_request": action, "allowed": allowed, "interrupt": payload},
            key=key,
        )
        decision = answer.get("decision") if isinstance(answer, dict) else None
        if decision == "approve":
            response: dict[str, Any] = {"type": "accept", "args": None}
        elif decision == "edit":
            response = {
                "type": "edit",
                "args": {"action": action.get("action"), "args": answer.get("args") or {}},
            }
        elif decision == "respond":
            response = {"type": "response", "args": str(answer.get("response") or "")}
        else:
            response = {"type": "ignore", "args": None}
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
        token = _current.set(_Superstep(ctx, number))
        ran: list[str] = []
        try:
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
        finally:
            _current.reset(token)
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
