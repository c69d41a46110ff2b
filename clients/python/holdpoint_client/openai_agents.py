"""Run an OpenAI Agents SDK agent as a Holdpoint agent
(``pip install "holdpoint-client[openai-agents]"``).

``openai_agent(name, agent)`` turns an SDK ``Agent`` into a Holdpoint ``Agent`` run by the
one runtime (``Worker``, ``holdpoint-worker``), one SDK turn per Holdpoint step:

- **The SDK's serialized ``RunState`` is the checkpoint.** A step restores the run from the
  checkpoint (``RunState.from_json``), runs one turn with ``Runner.run_streamed`` stopped
  ``after_turn`` (the model's answer and the tool calls it asked for), and saves
  ``RunState.to_json()`` as the next checkpoint. A worker killed inside a turn resumes from
  the last turn boundary: turns before it (model calls and tool calls) are never redone.
- **A tool with ``needs_approval`` is a Holdpoint approval.** The SDK stops the turn with an
  interruption; the interrupted state is saved as a checkpoint first (step ``review``), so
  the model is not asked again, and the next step asks an approval hold point per
  interruption (``auth_required``, the agent's approval policy applies). The decision goes
  back to the SDK: approve → ``state.approve(item)``; approve with edits →
  ``state.approve(item)`` and the tool is invoked with the edited arguments; send back →
  ``state.reject(item, rejection_message=<comment>)``; deny →
  ``state.reject(item, rejection_message="… denied …")``. Then the approved calls run and
  the step ends at the turn's end.
- **Side effects**: a tool that acts on the world calls ``side_effect(tool, target,
  request)`` (``holdpoint_client/adapters.py``, shared with the LangGraph adapter): the call
  goes through the ledger, exactly once across re-runs and crashes; an outcome lost is
  looked up by the next worker, or ``unknown`` and reconciled.

Limits: the run's SDK context is not kept (pass what tools need in the input or through
``current_context()``); only the starting agent's function tools are editable on the card
(an interruption of another agent's tool is approved or rejected as planned); runs are
streamed internally (the model must implement ``stream_response``); the SDK's own ``hooks``
and ``session`` are not used.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from holdpoint_client.adapters import args_schema, current_context, side_effect, step
from holdpoint_client.agent import Agent
from holdpoint_client.context import Context
from holdpoint_client.tools import Tool
from holdpoint_client.types import Deterministic, Done, Next, RetryPolicy

if TYPE_CHECKING:
    from agents import RunConfig, RunState
    from agents.items import ToolApprovalItem

__all__ = [
    "REVIEW_STEP",
    "TURN_STEP",
    "args_schema",
    "current_context",
    "openai_agent",
    "scripted_model",
    "side_effect",
]

TURN_STEP = "turn"
REVIEW_STEP = "review"

# The edited arguments of the calls approved with edits in this step, by call id: the
# wrapped tools read them (a context variable reaches the SDK's tasks and threads).
_edits: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "holdpoint_openai_agents_edits", default=None
)


def _arguments(item: ToolApprovalItem) -> dict[str, Any]:
    raw = item.raw_item
    text = raw.get("arguments") if isinstance(raw, dict) else getattr(raw, "arguments", None)
    try:
        value = json.loads(text) if isinstance(text, str) and text else {}
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}


def _call_id(item: ToolApprovalItem) -> str:
    raw = item.raw_item
    found = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
    return str(found or "")


_FORM_TYPES = {"string", "integer", "number", "boolean"}


def _form_schema(params: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """The tool's parameters as the card's form: its JSON schema when each parameter is a
    plain field (a string, a number, a boolean, a list of strings), else one field per
    planned argument (``args_schema``)."""
    properties = params.get("properties")
    if not isinstance(properties, dict):
        return args_schema(args)
    fields: dict[str, Any] = {}
    for name, spec in properties.items():
        if not isinstance(spec, dict):
            return args_schema(args)
        kind = spec.get("type")
        items = spec.get("items")
        if kind in _FORM_TYPES:
            field = {"type": kind}
        elif kind == "array" and isinstance(items, dict) and items.get("type") == "string":
            field = {"type": "array", "items": {"type": "string"}}
        else:
            return args_schema(args)
        for extra in ("title", "description", "enum", "maxLength", "minimum", "maximum"):
            if extra in spec:
                field[extra] = spec[extra]
        fields[str(name)] = field
    required = [str(n) for n in params.get("required", []) if n in fields]
    return {"type": "object", "properties": fields, "required": required}


def _review(
    ctx: Context,
    state: RunState[Any, Any],
    number: int,
    editable: dict[str, dict[str, Any]],
    own: str,
) -> dict[str, Any]:
    """One approval hold point per interruption of ``state``, in order; each decision is
    handed to the SDK. Returns the edited arguments by call id."""
    edits: dict[str, Any] = {}
    for index, item in enumerate(state.get_interruptions(), start=1):
        name = str(item.tool_name or "tool")[:100]
        args = _arguments(item)
        call_id = _call_id(item)
        # Only the starting agent's tools take edited arguments (``_editable_tools``).
        params = editable.get(name) if getattr(item.agent, "name", None) == own else None
        shown = json.dumps(args, ensure_ascii=False, default=str)
        approval = ctx.approve(
            name,
            "",
            args,
            # The agent's Holdpoint tool of that name, if any, says how far it can be undone.
            tool=name,
            prompt=f"Approve {name}({shown[:2000]})?",
            context={"agent": getattr(item.agent, "name", ""), "call_id": call_id},
            key=f"t{number}.approve{index}",
            editable=_form_schema(params, args) if params is not None else None,
            arguments=args,
        )
        if approval.approved:
            if approval.edited is not None and params is not None:
                edits[call_id] = approval.edited
            state.approve(item)
        elif approval.responded:
            # Sent back: the comment is what the model reads as the tool's answer; it goes on.
            state.reject(item, rejection_message=approval.comment or "Sent back without a comment.")
        else:
            by = f" by {approval.answered_by}" if approval.answered_by else ""
            why = f": {approval.comment.rstrip('.')}" if approval.comment else ""
            state.reject(
                item,
                rejection_message=f"A person denied this call of {name}{by}{why}. Do not call it again.",
            )
    return edits


def _editable_tools(sdk_agent: Any) -> tuple[Any, dict[str, dict[str, Any]]]:
    """A copy of ``sdk_agent`` whose function tools that may need approval take edited
    arguments (``_edits``), and their parameter schemas by name."""
    from agents import FunctionTool

    schemas: dict[str, dict[str, Any]] = {}
    tools: list[Any] = []
    for tool in sdk_agent.tools:
        if isinstance(tool, FunctionTool) and tool.needs_approval is not False:
            schemas[tool.name] = dict(tool.params_json_schema)
            tools.append(dataclasses.replace(tool, on_invoke_tool=_with_edits(tool.on_invoke_tool)))
        else:
            tools.append(tool)
    return sdk_agent.clone(tools=tools), schemas


def _with_edits(invoke: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    async def with_edits(tool_context: Any, arguments: str) -> Any:
        edited = (_edits.get() or {}).get(str(getattr(tool_context, "tool_call_id", "")))
        if edited is not None:
            arguments = json.dumps(edited)
        return await invoke(tool_context, arguments)

    return with_edits


def _as_json(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        value = dump(mode="json")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.loads(json.dumps(value, default=str))


def _snapshot(result: Any) -> Any:
    """The SDK's serialized ``RunState`` of ``result``, as plain JSON."""
    return json.loads(result.to_state().to_string())


def _sdk_input(value: Any) -> str:
    """The run's input as the SDK's: a string, the ``input`` of an object, or its JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("input"), str) and len(value) == 1:
        return value["input"]
    return json.dumps(value, ensure_ascii=False, default=str)


def openai_agent(
    name: str,
    sdk_agent: Any,
    *,
    input_schema: dict[str, Any] | None = None,
    tools: Iterable[Tool | str] = (),
    retry: RetryPolicy | None = None,
    description: str = "",
    label: str = "",
    approval_policy: dict[str, Any] | None = None,
    max_turns: int = 10,
    run_config: RunConfig | None = None,
) -> Agent:
    """An ``Agent`` that runs ``sdk_agent`` (an OpenAI Agents SDK ``Agent``), one turn per
    step: ``turn`` runs the model and the tools it calls, ``review`` asks people about the
    calls that need approval and runs them."""
    from agents import RunHooks, Runner, RunState
    from agents.exceptions import MaxTurnsExceeded

    agent = Agent(
        name=name,
        input_schema=input_schema if input_schema is not None else {"input": "string"},
        retry=retry,
        description=description or f"OpenAI Agents SDK agent {sdk_agent.name}",
        tools=tools,
        label=label,
        approval_policy=approval_policy,
    )
    runnable, editable = _editable_tools(sdk_agent)

    class StopAfterTurn(RunHooks[Any]):
        """Ends the streamed run at the end of the turn whose model call starts now."""

        result: Any = None

        async def on_llm_start(self, *args: Any, **kwargs: Any) -> None:
            current_context().check()  # A safe point before each model call.
            self.result.cancel(mode="after_turn")

    async def one_turn(ctx: Context, state: dict[str, Any], number: int) -> Next | Done:
        start: Any
        edits: dict[str, Any] = {}
        reviewing = False
        if "run_state" in state:
            # A copy: the SDK reads the snapshot in place, and the runtime keeps the checkpoint.
            saved = json.loads(json.dumps(state["run_state"]))
            start = await RunState.from_json(runnable, saved)
            reviewing = bool(start.get_interruptions())
            # A review: people decide, then the approved calls run and the turn ends.
            edits = _review(ctx, start, number, editable, runnable.name)
        else:
            start = _sdk_input(ctx.input)
        hooks = StopAfterTurn()
        token = _edits.set(edits)
        try:
            result = Runner.run_streamed(
                runnable, start, max_turns=max_turns, hooks=hooks, run_config=run_config
            )
            hooks.result = result
            if reviewing:
                # Resumed at an interruption: stop once the decided calls ran, before the
                # model is asked again (that is the next turn, after the next checkpoint).
                result.cancel(mode="after_turn")
            async for _ in result.stream_events():
                pass
        except MaxTurnsExceeded as exc:
            raise Deterministic(f"The agent ran past max_turns ({max_turns}).") from exc
        finally:
            _edits.reset(token)
        if result.interruptions:
            # Saved before anyone is asked, so that the answer does not ask the model again.
            return ctx.next(REVIEW_STEP, {"n": number, "run_state": _snapshot(result)})
        if result.final_output is not None:
            return ctx.done(
                {"output": _as_json(result.final_output), "agent": result.last_agent.name}
            )
        return ctx.next(TURN_STEP, {"n": number, "run_state": _snapshot(result)})

    def turn(ctx: Context, state: dict[str, Any]) -> Next | Done:
        number = int(state.get("n", 0)) + 1
        with step(ctx, number):
            return asyncio.run(one_turn(ctx, state, number))

    agent.step(TURN_STEP, start=True)(turn)
    agent.step(REVIEW_STEP)(turn)
    return agent


def scripted_model(respond: Callable[[list[Any]], list[Any]]) -> Any:
    """An SDK ``Model`` that answers each call with ``respond(input_items)`` (output items:
    ``agents.testing.function_call``, ``assistant_message``), through the SDK's own
    ``ScriptedModel``: no provider, no network. The answer depends on the conversation only,
    so a worker that runs a turn again gets the same answer (tests, demos)."""
    from agents.models.interface import Model
    from agents.testing import ScriptedModel

    class ConversationModel(Model):
        def _model(self, input: Any) -> Any:
            items = input if isinstance(input, list) else [{"role": "user", "content": input}]
            return ScriptedModel([respond(items)])

        async def get_response(
            self, system_instructions: Any, input: Any, *a: Any, **k: Any
        ) -> Any:
            return await self._model(input).get_response(system_instructions, input, *a, **k)

        async def stream_response(
            self, system_instructions: Any, input: Any, *a: Any, **k: Any
        ) -> Any:
            async for event in self._model(input).stream_response(
                system_instructions, input, *a, **k
            ):
                yield event

    return ConversationModel()
