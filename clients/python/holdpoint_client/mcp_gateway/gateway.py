"""The MCP gateway: an MCP server in front of other MCP servers, whose every session is a
Holdpoint run and whose side-effecting calls go through the ledger (docs/agents.md, "MCP
gateway").

How a session runs, on the one agent runtime (``Agent``, ``Context``, ``Worker``):

- The first request of an MCP session starts a run of the gateway's agent (with the API
  token). The gateway's ``Worker`` (the worker token) claims its attempt: step ``serve``
  waits for the session's calls, at a safe point every second (a cancel unwinds it; a
  pause returns at the step boundary and the executor releases the attempt).
- A ``pass`` call goes straight to the downstream server. A ``record`` or ``approve``
  call is handed to ``serve``, which checkpoints it as step ``call`` with the exact
  arguments. ``call`` makes it with ``ctx.side_effect``: the ledger's key is written
  before the call and passed to the downstream server in ``_meta``; an ``approve`` call
  is begun ``irreversible``, so the ledger refuses it without an approval of exactly this
  call and the step becomes a hold point (the card shows the arguments, editable against
  the tool's ``inputSchema``). After the decision a new attempt runs ``call`` again: the
  approved (possibly edited) call is made once, and its outcome recorded.
- The same call again (tool and arguments, and ``_meta["holdpoint/idempotency_key"]`` if
  the client gives one) in the session is the same ledger key: a call still waiting joins
  the request; a call done answers the recorded result.
- A gateway killed between the downstream call and its outcome leaves the record
  ``pending``: the next attempt looks the key up with the server's ``lookup`` tool, or
  records ``unknown`` for a person to settle (the ledger's rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, cast

import mcp_types as types
from mcp import Client, StdioServerParameters

from holdpoint_client.agent import Agent
from holdpoint_client.context import Context
from holdpoint_client.control import CancelRequested, HoldPointReached, SideEffectUnknown
from holdpoint_client.http import Api, Problem, ServerAway
from holdpoint_client.mcp_gateway.config import Config, Downstream
from holdpoint_client.mcp_gateway.rules import RuleBook
from holdpoint_client.tools import ActionFailed, Outcome, OutcomeUnknown, ToolResult
from holdpoint_client.types import ApprovalDenied, Done, Next, RetryPolicy, SideEffectFailed
from holdpoint_client.worker import Worker

logger = logging.getLogger("holdpoint.mcp_gateway")

KEY_META = "holdpoint/idempotency_key"
SESSION_META = "holdpoint/session"
SEPARATOR = "__"
MAX_ARGUMENTS = 64 * 1024
MAX_RESULT = 256 * 1024
MAX_NOTES = 50
MAX_CALLS_KEPT = 1000  # calls a session remembers (the ledger remembers them all)
START_WAIT = 30.0  # how long serve waits for the session of a run being started

# What the downstream server reported during the call the step is making (its thread).
_notes = threading.local()


def tool_name(server: str, tool: str) -> str:
    """The name a client sees, and the ledger's tool: ``<server>__<tool>``."""
    return f"{server}{SEPARATOR}{tool}"


def call_key(server: str, tool: str, arguments: Any, client_key: str = "") -> str:
    """The ledger key of a call in a session: the same call again is the same key."""
    canonical = json.dumps(
        [server, tool, arguments, client_key], sort_keys=True, separators=(",", ":")
    )
    return "mcp-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _dump(result: types.CallToolResult) -> dict[str, Any]:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def _error_result(text: str, **meta: Any) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        is_error=True,
        _meta={f"holdpoint/{k}": v for k, v in meta.items()} or None,
    )


# Sessions and their calls ------------------------------------------------------------------


@dataclass
class Call:
    key: str
    server: str
    tool: str
    arguments: dict[str, Any]
    rule: str
    loop: asyncio.AbstractEventLoop
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: dict[str, Any] | None = None
    request_id: str = ""

    def finish(self, result: dict[str, Any]) -> None:
        self.result = result
        self.loop.call_soon_threadsafe(self.done.set)

    def as_state(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "server": self.server,
            "tool": self.tool,
            "arguments": self.arguments,
            "rule": self.rule,
        }


@dataclass
class Session:
    key: str
    run_id: str
    inbox: queue.Queue[Call] = field(default_factory=queue.Queue)
    calls: dict[str, Call] = field(default_factory=dict)
    stopped: str = ""
    serving: bool = False
    finished: bool = False
    api: Any = None  # the Holdpoint API as the person who started the session
    lock: threading.Lock = field(default_factory=threading.Lock)


class Sessions:
    def __init__(self) -> None:
        self.starting = 0  # runs being started (their sessions not registered yet)
        self._lock = threading.Lock()
        self._by_key: dict[str, Session] = {}
        self._by_run: dict[str, Session] = {}

    def get(self, key: str) -> Session | None:
        with self._lock:
            return self._by_key.get(key)

    def of_run(self, run_id: str) -> Session | None:
        with self._lock:
            return self._by_run.get(run_id)

    def add(self, session: Session) -> None:
        with self._lock:
            self._by_key[session.key] = session
            self._by_run[session.run_id] = session

    def all(self) -> list[Session]:
        with self._lock:
            return list(self._by_key.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_key)


# Downstream servers ------------------------------------------------------------------------


class Downstreams:
    """The open client sessions to the downstream servers, in the gateway's event loop;
    worker threads call through ``call_sync``."""

    def __init__(self, servers: tuple[Downstream, ...]) -> None:
        self.specs = {server.name: server for server in servers}
        self.clients: dict[str, Client] = {}
        self.tools: dict[str, list[types.Tool]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stack = contextlib.AsyncExitStack()

    async def open(self) -> None:
        self.loop = asyncio.get_running_loop()
        for name, spec in self.specs.items():
            target: Any = (
                spec.url
                if spec.url
                else StdioServerParameters(
                    command=spec.command[0], args=list(spec.command[1:]), env=spec.env or None
                )
            )
            client = await self._stack.enter_async_context(
                Client(
                    target,
                    client_info=types.Implementation(name="holdpoint-mcp-gateway", version="1"),
                )
            )
            self.clients[name] = client
            listed = await client.list_tools()
            self.tools[name] = list(listed.tools)
            logger.info("downstream %s: %d tools", name, len(listed.tools))

    async def close(self) -> None:
        await self._stack.aclose()

    async def call(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        key: str | None,
        notes: list[str] | None = None,
    ) -> types.CallToolResult:
        """Call ``tool``; what the server reports while it runs (its progress messages)
        is appended to ``notes``."""
        meta = cast(types.RequestParamsMeta, {KEY_META: key}) if key else None

        async def reported(progress: float, total: float | None, message: str | None) -> None:
            if notes is not None and message and len(notes) < MAX_NOTES:
                notes.append(message[:500])

        return await self.clients[server].call_tool(
            tool, arguments, meta=meta, progress_callback=reported if notes is not None else None
        )

    def call_sync(
        self,
        server: str,
        tool: str,
        arguments: dict[str, Any],
        key: str | None,
        notes: list[str] | None = None,
    ) -> types.CallToolResult:
        assert self.loop is not None
        future = asyncio.run_coroutine_threadsafe(
            self.call(server, tool, arguments, key, notes), self.loop
        )
        return future.result()

    def schema(self, server: str, tool: str) -> dict[str, Any] | None:
        for listed in self.tools.get(server, []):
            if listed.name == tool:
                return dict(listed.input_schema)
        return None


class McpTool:
    """One downstream tool as a ledger tool: ``execute`` calls it with the ledger's key in
    ``_meta``; ``lookup`` asks the server's look-up tool, when it has one."""

    reversibility = "reversible"

    def __init__(self, downstreams: Downstreams, server: str, tool: types.Tool) -> None:
        self.downstreams = downstreams
        self.server = server
        self.tool = tool.name
        self.name = tool_name(server, tool.name)
        # The approval card's form: the tool's own input schema.
        self.edit_schema = dict(tool.input_schema)
        self.lookup_tool = downstreams.specs[server].lookup
        self.can_look_up = bool(self.lookup_tool)

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        notes = getattr(_notes, "current", None)
        try:
            result = self.downstreams.call_sync(
                self.server, self.tool, request, idempotency_key, notes
            )
        except Exception as exc:  # the call was sent: whether it acted is not known
            raise OutcomeUnknown(f"{type(exc).__name__}: {exc}") from exc
        dumped = _dump(result)
        if len(json.dumps(dumped)) > MAX_RESULT:
            dumped = {"content": [{"type": "text", "text": "(result too large to record)"}]}
        if result.is_error:
            raise ActionFailed(_text(result) or "the tool answered an error", result=dumped)
        return ToolResult(result=dumped, external_reference=idempotency_key)

    def lookup(self, idempotency_key: str) -> Outcome | None:
        if not self.lookup_tool:
            raise OutcomeUnknown(
                f"{self.server} has no look-up tool: a person must say whether it happened"
            )
        try:
            found = self.downstreams.call_sync(
                self.server, self.lookup_tool, {"idempotency_key": idempotency_key}, None
            )
        except Exception as exc:
            raise OutcomeUnknown(f"look-up failed: {type(exc).__name__}: {exc}") from exc
        answer = found.structured_content or {}
        if found.is_error or not isinstance(answer, dict) or "found" not in answer:
            raise OutcomeUnknown("the look-up tool gave no answer the gateway can read")
        if not answer["found"]:
            return None
        return Outcome(
            status="confirmed",
            external_reference=idempotency_key,
            result={"looked_up": answer.get("result")},
        )


def _text(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))[
        :2000
    ]


# The gateway -------------------------------------------------------------------------------


class Gateway:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.downstreams = Downstreams(config.servers)
        self.sessions = Sessions()
        # The people whose clients call, by token: each starts and watches its own runs.
        self._people: dict[str, Api] = {}
        self._verified: dict[str, float] = {}
        self._budgets: dict[str, tuple[float, float]] = {}
        self.worker_api = Api(config.holdpoint_url, config.worker_token, stop=threading.Event())
        self.rules = RuleBook(self._fetch_rules)
        self.worker: Worker | None = None
        self.agent: Agent | None = None
        self._start_lock = asyncio.Lock()

    # Start and stop ---------------------------------------------------------------------

    async def start(self) -> None:
        await self.downstreams.open()
        self.agent = self._agent()
        self.worker = Worker(
            self.config.holdpoint_url,
            self.config.worker_token,
            [self.agent],
            concurrency=self.config.max_sessions,
            name=f"mcp-gateway-{self.config.agent}",
            lease_seconds=self.config.lease_seconds,
        )
        await asyncio.to_thread(self.worker.start)
        await asyncio.to_thread(self._offer_tools)

    async def stop(self, settle: float = 3.0) -> None:
        """Stop serving. A session its client closed gets up to ``settle`` seconds for its
        run to finish (the call it made may still be saving its checkpoint); the other
        sessions' attempts are handed back at their step boundary."""
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and any(
            s.stopped == "ended" and not s.finished for s in self.sessions.all()
        ):
            await asyncio.sleep(0.05)
        if self.worker is not None:
            await asyncio.to_thread(self.worker.stop, 5.0)
        await self.downstreams.close()

    def _offer_tools(self) -> None:
        """Tell the server which tools the downstream servers offer (their annotations
        suggest rules a person confirms); keep the rules it answers."""
        offered = [
            {
                "server": server,
                "name": tool.name,
                "description": (tool.description or "")[:2000],
                "input_schema": dict(tool.input_schema),
                "annotations": (
                    tool.annotations.model_dump(by_alias=True, exclude_none=True)
                    if tool.annotations
                    else {}
                ),
            }
            for server, tools in self.downstreams.tools.items()
            for tool in tools
        ]
        try:
            _, data = self.worker_api.call(
                "PUT", f"/api/worker/agents/{self.config.agent}/mcp-tools", {"tools": offered}
            )
            self.rules.replace(data.get("rules", []))
        except (Problem, ServerAway) as exc:
            logger.warning("could not offer the tools to Holdpoint (every call asks): %s", exc)

    def _fetch_rules(self) -> list[dict[str, Any]]:
        _, data = self.worker_api.call(
            "GET", f"/api/worker/agents/{self.config.agent}/mcp-tools", retry_for=5.0
        )
        return list(data.get("rules", []))

    # The agent --------------------------------------------------------------------------

    def _agent(self) -> Agent:
        tools = [
            McpTool(self.downstreams, server, tool)
            for server, listed in self.downstreams.tools.items()
            for tool in listed
        ]
        agent = Agent(
            name=self.config.agent,
            description="MCP gateway: " + ", ".join(self.downstreams.specs),
            input_schema={
                "type": "object",
                "properties": {"session": {"type": "string"}, "client": {"type": "string"}},
            },
            tools=tools,
            label="MCP session of {client}",
            # An attempt lost with the gateway is tried again (its calls are in the ledger).
            retry=RetryPolicy(max_attempts=20),
        )
        agent.step("serve", start=True)(self._serve)
        agent.step("call")(self._call)
        return agent

    def _serve(self, ctx: Context, state: Any) -> Next | Done:
        """Wait for the session's next ledger call; the session's end ends the run."""
        state = dict(state or {})
        session = self.sessions.of_run(ctx.run_id)
        waited = 0.0
        while session is None and self.sessions.starting and waited < START_WAIT:
            # The run was claimed before the request that started it came back: its
            # session is registered in a moment.
            ctx.sleep(0.1)
            waited += 0.1
            session = self.sessions.of_run(ctx.run_id)
        if session is None:
            # The gateway that held the session is gone (a restart): nobody can call again.
            return ctx.done({"calls": state.get("calls", 0), "ended": "session gone"})
        if session.stopped == "paused":
            session.stopped = ""
        session.serving = True
        idle = 0.0
        try:
            while True:
                try:
                    ctx.check()
                except CancelRequested:
                    session.stopped = "cancelled"
                    self._refuse_waiting(session, "The run was cancelled: no more calls.")
                    raise
                if ctx.pause_requested:
                    # Seen at the step boundary: the executor releases the attempt.
                    session.stopped = "paused"
                    return ctx.next("serve", state)
                if session.stopped == "ended" or idle >= self.config.idle_seconds:
                    why = "session closed" if session.stopped == "ended" else "session idle"
                    session.stopped = "ended"
                    done = ctx.done({"calls": state.get("calls", 0), "ended": why})
                    session.finished = True
                    return done
                if self.worker is not None and self.worker.shutdown.is_set():
                    # The gateway stops: the boundary hands the attempt back at once.
                    return ctx.next("serve", state)
                try:
                    call = session.inbox.get(timeout=1.0)
                except queue.Empty:
                    idle += 1.0
                    continue
                state["call"] = call.as_state()
                return ctx.next("call", state)
        finally:
            session.serving = False

    def _call(self, ctx: Context, state: Any) -> Next:
        state = dict(state)
        planned = state.pop("call")
        session = self.sessions.of_run(ctx.run_id)
        waiting = session.calls.get(planned["key"]) if session else None
        server, tool = planned["server"], planned["tool"]
        notes: list[str] = []
        _notes.current = notes
        try:
            done = ctx.side_effect(
                tool_name(server, tool),
                server,
                planned["arguments"],
                key=planned["key"],
                reversibility="irreversible" if planned["rule"] == "approve" else None,
                approval={
                    "title": f"{tool} on {server}",
                    "prompt": f"Call {tool} on {server} with these arguments?",
                    "context": {"server": server, "tool": tool, "rule": planned["rule"]},
                },
            )
            result = dict(done.result or {})
            if done.decision == "act":
                self._cost(ctx, result)
        except HoldPointReached as held:
            if waiting is not None:
                waiting.request_id = held.request_id
            raise
        except ApprovalDenied as denied:
            result = _dump(_error_result(str(denied), status="denied"))
        except SideEffectFailed as failed:
            error = failed.error if isinstance(failed.error, dict) else {}
            recorded = (error.get("details") or {}).get("result") if error else None
            result = recorded or _dump(_error_result(str(failed), status="failed"))
        except SideEffectUnknown as unknown:
            if waiting is not None:
                waiting.finish(
                    _dump(
                        _error_result(
                            f"Whether {tool} happened is not known; a person settles it on "
                            f"Holdpoint ({unknown.operation_id}).",
                            status="unknown",
                            operation_id=unknown.operation_id,
                        )
                    )
                )
            raise
        finally:
            _notes.current = None
        for note in notes:
            # What the downstream server reported while the call ran, in the run's log.
            ctx.log(note, server=server, tool=tool)
        if waiting is not None:
            waiting.finish(result)
        state["calls"] = int(state.get("calls", 0)) + 1
        return ctx.next("serve", state)

    @staticmethod
    def _cost(ctx: Context, result: dict[str, Any]) -> None:
        """A downstream server that reports a cost in the result's ``_meta``."""
        meta = result.get("_meta") or {}
        amount = meta.get("holdpoint/cost", meta.get("cost")) if isinstance(meta, dict) else None
        if amount is None:
            return
        try:
            ctx.cost(Decimal(str(amount)))
        except (InvalidOperation, ValueError):
            ctx.log("The downstream server reported a cost that is not a number.", level="warning")

    def _refuse_waiting(self, session: Session, text: str) -> None:
        with session.lock:
            pending = [c for c in session.calls.values() if c.result is None]
        for call in pending:
            call.finish(_dump(_error_result(text, status=session.stopped or "stopped")))

    # The MCP side -----------------------------------------------------------------------

    def _person_api(self, token: str) -> Api:
        return Api(
            self.config.holdpoint_url,
            token,
            stop=threading.Event(),
            headers={"Authorization": f"Token {token}"},
        )

    def api_for(self, token: str) -> Api:
        """The Holdpoint API as the person whose API token a client presented (kept for
        tokens Holdpoint accepted only)."""
        api = self._people.get(token)
        if api is None:
            api = self._people[token] = self._person_api(token)
        return api

    async def verify(self, token: str) -> bool:
        """Whether Holdpoint knows ``token`` (a person's API token): asked at most once a
        minute per token; a refusal is not remembered, so a new token works at once."""
        if not token or len(token) > 200:
            return False
        if self._verified.get(token, 0.0) > time.monotonic():
            return True
        known = token in self._people
        api = self._people[token] if known else self._person_api(token)
        try:
            await asyncio.to_thread(
                api.call, "GET", f"/api/runs?agent={self.config.agent}&limit=1", retry_for=5.0
            )
        except (Problem, ServerAway):
            if not known:
                api.close()  # nothing is kept for a token Holdpoint refused
            return False
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._people.setdefault(token, api)
        self._verified[token] = time.monotonic() + 60.0
        return True

    def allow(self, token: str) -> bool:
        """A person's calls per minute (``calls_per_minute``), as a token bucket."""
        rate = self.config.calls_per_minute / 60.0
        now = time.monotonic()
        level, at = self._budgets.get(token, (float(self.config.calls_per_minute), now))
        level = min(float(self.config.calls_per_minute), level + (now - at) * rate)
        if level < 1.0:
            self._budgets[token] = (level, now)
            return False
        self._budgets[token] = (level - 1.0, now)
        return True

    async def session_for(self, key: str, client: str, token: str) -> Session:
        # One person's session name is not another's: the key carries who.
        key = hashlib.sha256(token.encode()).hexdigest()[:16] + ":" + key
        session = self.sessions.get(key)
        if session is not None:
            return session
        async with self._start_lock:
            session = self.sessions.get(key)
            if session is not None:
                return session
            if len(self.sessions) >= 10 * self.config.max_sessions:
                raise RuntimeError("too many sessions")
            self.sessions.starting += 1
            try:
                api = self.api_for(token)
                _, run = await asyncio.to_thread(
                    api.call,
                    "POST",
                    "/api/runs",
                    {"agent": self.config.agent, "input": {"session": key, "client": client[:100]}},
                    key=f"mcp-session-{self.config.agent}-{key}"[:255],
                )
                session = Session(key=key, run_id=run["run_id"], api=api)
                self.sessions.add(session)
            finally:
                self.sessions.starting -= 1
            logger.info("session %s is run %s", key, run["run_id"])
            return session

    async def list_tools(self) -> types.ListToolsResult:
        listed = []
        for server, tools in self.downstreams.tools.items():
            for tool in tools:
                listed.append(
                    tool.model_copy(
                        update={
                            "name": tool_name(server, tool.name),
                            "description": f"[{server}] {tool.description or ''}".strip(),
                        }
                    )
                )
        return types.ListToolsResult(tools=listed)

    async def call_tool(
        self,
        session: Session,
        name: str,
        arguments: dict[str, Any],
        *,
        client_key: str = "",
        progress: Any = None,
    ) -> types.CallToolResult:
        server, _, tool = name.partition(SEPARATOR)
        if server not in self.downstreams.clients or self.downstreams.schema(server, tool) is None:
            return _error_result(f"Unknown tool {name!r}.", status="unknown_tool")
        if len(json.dumps(arguments)) > MAX_ARGUMENTS:
            return _error_result("The arguments are too large (64 kB at most).", status="too_large")
        if session.stopped in ("", "paused") and not session.serving:
            # Nobody serves the run (it waits for an approval, or is paused): is it on?
            await self._check_run(session)
        if session.stopped in ("cancelled", "paused", "ended"):
            return _error_result(
                f"Run {session.run_id} is {session.stopped}: the gateway makes no more calls "
                "for this session.",
                status=session.stopped,
                run_id=session.run_id,
            )
        rule = await asyncio.to_thread(self.rules.rule, server, tool, arguments)
        if rule == "pass":
            try:
                return await self.downstreams.call(server, tool, arguments, None)
            except Exception as exc:  # noqa: BLE001 - a read that failed: say so
                return _error_result(f"{name} failed: {type(exc).__name__}: {exc}")
        key = call_key(server, tool, arguments, client_key)
        with session.lock:
            call = session.calls.get(key)
            joined = call is not None
            if call is None:
                if len(session.calls) >= MAX_CALLS_KEPT:
                    # Forget the oldest finished calls: a repeat of one is made again as the
                    # same step key, which the ledger answers with the recorded result.
                    for old in [k for k, c in session.calls.items() if c.result is not None][
                        : MAX_CALLS_KEPT // 2
                    ]:
                        del session.calls[old]
                call = Call(
                    key=key,
                    server=server,
                    tool=tool,
                    arguments=arguments,
                    rule=rule,
                    loop=asyncio.get_running_loop(),
                )
                session.calls[key] = call
        if not joined:
            session.inbox.put(call)
        return await self._wait(session, call, progress)

    async def _wait(self, session: Session, call: Call, progress: Any) -> types.CallToolResult:
        """The call's result, or "approval pending" when it is not decided in time. With a
        progress token, progress notifications say what it waits for, every 5 s."""
        limit = self.config.progress_wait_seconds if progress else self.config.wait_seconds
        waited = 0.0
        while call.result is None and waited < limit:
            step = min(5.0, limit - waited)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(call.done.wait(), timeout=step)
            waited += step
            if call.result is None:
                await self._check_run(session)
            if call.result is None and progress is not None:
                with contextlib.suppress(Exception):
                    await progress(waited, self._pending_text(session, call))
        if call.result is not None:
            return types.CallToolResult.model_validate(call.result)
        return _error_result(
            self._pending_text(session, call)
            + " Call the tool again with the same arguments to get its result.",
            status="pending",
            run_id=session.run_id,
            request_id=call.request_id,
            url=f"{self.config.holdpoint_url}/runs/{session.run_id}/",
        )

    async def _check_run(self, session: Session) -> None:
        """A run that ended while no attempt served it (cancelled while a call waited for
        its approval, say) ends the session: its waiting calls are answered."""
        try:
            _, run = await asyncio.to_thread(
                session.api.call, "GET", f"/api/runs/{session.run_id}", retry_for=5.0
            )
        except (Problem, ServerAway):
            return
        status = run.get("status") if isinstance(run, dict) else None
        if status in ("cancelled", "cancel_requested", "failed", "succeeded"):
            session.stopped = "cancelled" if status.startswith("cancel") else "ended"
            self._refuse_waiting(session, f"Run {session.run_id} is {status}: no more calls.")
        elif status in ("paused", "pause_requested"):
            # Paused at a step boundary, maybe before serve ran again: no calls for now.
            session.stopped = "paused"
        elif session.stopped == "paused":
            session.stopped = ""  # continued

    def _pending_text(self, session: Session, call: Call) -> str:
        if call.request_id:
            return (
                f"Waiting for approval: request {call.request_id} of run {session.run_id} "
                f"({self.config.holdpoint_url}/runs/{session.run_id}/)."
            )
        return f"Waiting for run {session.run_id} to make the call."

    def end_session(self, key: str, token: str) -> None:
        key = hashlib.sha256(token.encode()).hexdigest()[:16] + ":" + key
        session = self.sessions.get(key)
        if session is not None and not session.stopped:
            logger.info("session %s (run %s) closed by the client", key, session.run_id)
            session.stopped = "ended"


def new_session_key() -> str:
    return uuid.uuid4().hex
