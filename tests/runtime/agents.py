"""Agents for the process tests, imported by the test process (so run_start accepts them)
and by each ``runagents`` subprocess (``HOLDPOINT_AGENT_MODULES``).

Each step appends one JSON line to ``input["journal"]`` (a file shared by the test and
its workers): which attempt ran which step in which process, and when. A line of a few
hundred bytes written with O_APPEND is not interleaved with other writers.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
