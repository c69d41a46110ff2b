"""Agents for the latency benchmarks, loaded by the benchmark's own worker processes only
(``HOLDPOINT_AGENT_MODULES=runtime.demo_agents,bench.agents``).

``bench-latency`` asks a question first when its input says so, then works in short
steps: every step boundary is a checkpoint, and every ``ctx.sleep`` a safe point.
The step after the question writes the time it started running into its state, so
the benchmark reads "the step running again" from the checkpoint, not from a guess.
"""

from __future__ import annotations

import time
from typing import Any

from runtime.sdk import Agent, Context, Done, Next, RetryPolicy

agent = Agent(
    name="bench-latency",
    description="Benchmark agent: an optional question, then short checkpointed steps.",
    input_schema={
        "type": "object",
        "properties": {
            "ask": {"type": "boolean"},
            "steps": {"type": "integer", "minimum": 1, "maximum": 100000},
            "step_seconds": {"type": "number", "minimum": 0, "maximum": 60},
        },
    },
    retry=RetryPolicy(max_attempts=3, backoff_initial=0.0, jitter=0.0, max_lease_losses=5),
)


@agent.step("start", start=True)
def start(ctx: Context, state: dict[str, Any]) -> Next | Done:
    if ctx.input.get("ask"):
        ctx.ask("Go on?", {"type": "object", "properties": {"go": {"type": "boolean"}}})
    # Reached at once on the first attempt, or when the answer came back (resume).
    return ctx.next("work", {"i": 0, "running_at": time.time()})


@agent.step("work")
def work(ctx: Context, state: dict[str, Any]) -> Next | Done:
    ctx.sleep(float(ctx.input.get("step_seconds", 0.05)))
    i = int(state.get("i", 0)) + 1
    if i >= int(ctx.input.get("steps", 1)):
        return ctx.done({"steps": i})
    return ctx.next("work", {"i": i, "at": time.time()})
