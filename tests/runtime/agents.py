"""Agents for the process tests, imported by the test process (so run_start accepts them)
and by each ``runagents`` subprocess (``HOLDPOINT_AGENT_MODULES``).

Each step appends one JSON line to ``input["journal"]`` (a file shared by the test and
its workers): which attempt ran which step in which process, and when. A line of a few
hundred bytes written with O_APPEND is not interleaved with other writers.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ledger.tools import Outcome as LedgerOutcome
from ledger.tools import OutcomeUnknown, ToolResult, register_tool
from runtime.sdk import Agent, Context, Done, Next, RetryPolicy

POLICY = RetryPolicy(
    max_attempts=4,
    backoff_initial=0.2,
    backoff_max=0.5,
    jitter=0.0,
    repeated_error_threshold=3,
    max_lease_losses=2,
)


def journal(ctx: Context, event: str, **extra: Any) -> None:
    line = {
        "event": event,
        "run_id": ctx.run_id,
        "attempt_id": ctx.attempt_id,
        "attempt": ctx.attempt_number,
        "step": ctx.step,
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
        "t": time.time(),
        **extra,
    }
    with open(ctx.input["journal"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


@contextmanager
def span(ctx: Context) -> Iterator[None]:
    """Journal the time this step ran in this process, however it ends."""
    started = time.time()
    try:
        yield
    finally:
        journal(ctx, "span", t0=started, t1=time.time())


# Many runs: three short steps; some ask a person, some fail once. ----------------------
steps = Agent(name="proc-steps", retry=POLICY)


@steps.step("one")
def one(ctx: Context, state: dict[str, Any]) -> Next | Done:
    with span(ctx):
        time.sleep(float(ctx.input.get("slow", 0.05)))
        return ctx.next("two", {"n": ctx.input["n"]})


@steps.step("two")
def two(ctx: Context, state: dict[str, Any]) -> Next | Done:
    with span(ctx):
        time.sleep(0.1)
        if ctx.input.get("flaky") and ctx.attempt_number == 1:
            raise ConnectionError("worker lost the connection")
        if ctx.input.get("ask"):
            ctx.ask("Keep going?", {"go": "boolean"})
        return ctx.next("three", state)


@steps.step("three")
def three(ctx: Context, state: dict[str, Any]) -> Next | Done:
    with span(ctx):
        time.sleep(0.05)
        return ctx.done({"n": state["n"], "by": os.getpid()})


# Crash mid-step: the first attempt hangs in "work" until the test kills or stops it. --
crash = Agent(name="proc-crash", retry=POLICY)


@crash.step("prepare")
def prepare(ctx: Context, state: dict[str, Any]) -> Next | Done:
    journal(ctx, "prepare")
    return ctx.next("work", {"prepared_by": os.getpid()})


@crash.step("work")
def work(ctx: Context, state: dict[str, Any]) -> Next | Done:
    journal(ctx, "entered")
    if ctx.attempt_number == 1:
        time.sleep(float(ctx.input.get("hang", 60)))  # not ctx.sleep: a step that is busy
    journal(ctx, "finishing")
    return ctx.done({**state, "finished_by": os.getpid(), "attempt": ctx.attempt_number})


# Cancel: a step that waits cooperatively. -----------------------------------------------
waits = Agent(name="proc-wait", retry=POLICY)


@waits.step("wait")
def wait(ctx: Context, state: dict[str, Any]) -> Next | Done:
    journal(ctx, "entered")
    ctx.sleep(60)
    journal(ctx, "woke")
    return ctx.next("after", {})


@waits.step("after")
def after(ctx: Context, state: dict[str, Any]) -> Next | Done:
    journal(ctx, "after")
    return ctx.done("should not happen")


# Poison: the step kills its own worker every time. --------------------------------------
poison = Agent(name="proc-poison", retry=POLICY)


@poison.step("boom")
def boom(ctx: Context, state: dict[str, Any]) -> Next | Done:
    journal(ctx, "entered")
    os.kill(os.getpid(), signal.SIGKILL)
    return ctx.done("unreachable")


# Quick: one step, for wake-up latency. ---------------------------------------------------
quick = Agent(name="proc-quick", retry=POLICY)


@quick.step("only")
def only(ctx: Context, state: dict[str, Any]) -> Next | Done:
    return ctx.done({"pid": os.getpid()})


# Side effects in flight: a tool whose "external system" is a folder. ---------------------
class FolderTool:
    """An "external system" in a folder (``HOLDPOINT_TEST_TOOL_DIR``).

    ``execute`` marks the key in progress, does the work after ``delay_before`` seconds,
    then answers ``delay_after`` seconds later; a key already done is not done again.
    ``lookup`` says done (confirmed), in progress (unknown) or never seen (None). Every
    call of ``execute`` is journaled, to count repeats.
    """

    name = "folder"
    reversibility = "reversible"

    @staticmethod
    def _paths(idempotency_key: str) -> tuple[Path, Path]:
        folder = Path(os.environ["HOLDPOINT_TEST_TOOL_DIR"])
        digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:16]
        return folder / f"{digest}.inflight", folder / f"{digest}.done"

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        inflight, done = self._paths(idempotency_key)
        with open(inflight.parent / "executions.log", "a", encoding="utf-8") as fh:
            fh.write(f"{idempotency_key} {os.getpid()}\n")
        if not done.exists():
            inflight.write_text(str(os.getpid()))
            time.sleep(float(request.get("delay_before", 0)))
            done.write_text(json.dumps({"by": os.getpid()}))
            inflight.unlink()
        time.sleep(float(request.get("delay_after", 0)))  # the answer is slow to come back
        record = json.loads(done.read_text())
        return ToolResult(external_reference=f"rec-{record['by']}", result=record)

    def lookup(self, idempotency_key: str) -> LedgerOutcome | None:
        inflight, done = self._paths(idempotency_key)
        if done.exists():
            record = json.loads(done.read_text())
            return LedgerOutcome(
                status="confirmed", external_reference=f"rec-{record['by']}", result=record
            )
        if inflight.exists():
            raise OutcomeUnknown("the request with this key is still being processed")
        return None


register_tool(FolderTool())

effects = Agent(name="proc-effect", retry=POLICY)


@effects.step("prepare")
def effect_prepare(ctx: Context, state: dict[str, Any]) -> Next | Done:
    journal(ctx, "prepare")
    return ctx.next("act", {})


@effects.step("act")
def effect_act(ctx: Context, state: dict[str, Any]) -> Next | Done:
    journal(ctx, "entered")
    written = ctx.side_effect(
        "folder",
        "test folder",
        {
            "delay_before": ctx.input.get("delay_before", 0),
            "delay_after": ctx.input.get("delay_after", 0),
        },
    )
    journal(ctx, "acted", decision=written.decision)
    return ctx.next("finish", {"ref": written.external_reference})


@effects.step("finish")
def effect_finish(ctx: Context, state: dict[str, Any]) -> Next | Done:
    return ctx.done({**state, "finished_by": os.getpid()})


# Pause: a step that is busy until the test lets it go, with a side effect. ----------------
pausing = Agent(name="proc-pause", retry=POLICY)


def _wait_for_file(path: str, limit: float = 30.0) -> None:
    """Busy in the step (not ctx.sleep): a pause must not cut it short."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@pausing.step("work")
def pause_work(ctx: Context, state: dict[str, Any]) -> Next | Done:
    journal(ctx, "entered")
    _wait_for_file(ctx.input["go"])
    written = ctx.side_effect("folder", "test folder", {"delay_before": 0})
    journal(ctx, "finished", decision=written.decision)
    return ctx.next("after", {"ref": written.external_reference})


@pausing.step("after")
def pause_after(ctx: Context, state: dict[str, Any]) -> Next | Done:
    journal(ctx, "after")
    return ctx.done({**state, "by": os.getpid()})


# The agent gate: many runs of short steps. ------------------------------------------------
gated = Agent(name="proc-gate", retry=POLICY)


def _gate_step(ctx: Context, state: dict[str, Any], next_step: str | None) -> Next | Done:
    time.sleep(float(ctx.input.get("slow", 0.15)))
    journal(ctx, "step")
    if next_step is None:
        return ctx.done({"n": ctx.input["n"]})
    return ctx.next(next_step, state)


@gated.step("one")
def gate_one(ctx: Context, state: dict[str, Any]) -> Next | Done:
    return _gate_step(ctx, state, "two")


@gated.step("two")
def gate_two(ctx: Context, state: dict[str, Any]) -> Next | Done:
    return _gate_step(ctx, state, "three")


@gated.step("three")
def gate_three(ctx: Context, state: dict[str, Any]) -> Next | Done:
    return _gate_step(ctx, state, "four")


@gated.step("four")
def gate_four(ctx: Context, state: dict[str, Any]) -> Next | Done:
    return _gate_step(ctx, state, None)
