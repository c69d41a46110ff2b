"""An agent for the live dashboard's browser test, imported by the test process (so
``run_start`` accepts it) and by its ``runagents`` worker (``HOLDPOINT_AGENT_MODULES``).

The test decides when the step goes on by creating files next to ``input["gate"]``:
``.ask`` lets it ask its question, ``.finish`` lets it finish after the answer.
"""

from __future__ import annotations

import os
from typing import Any

from runtime.sdk import Agent, Context, Done, Next, RetryPolicy

QUESTION = "Ship build 42 to staging?"
SCHEMA = {
    "type": "object",
    "properties": {
        "decision": {"type": "string", "title": "Decision", "enum": ["ship", "hold"]},
    },
    "required": ["decision"],
}

ship = Agent(
    name="live-ship",
    description="Waits for the test, asks whether to ship, waits again, finishes.",
    retry=RetryPolicy(max_attempts=2, backoff_initial=0.1, jitter=0.0),
)


def wait_for(ctx: Context, path: str) -> None:
    while not os.path.exists(path):
        ctx.sleep(0.05)  # a safe point: a cancel stops it here


@ship.step("ship", start=True)
def ship_step(ctx: Context, state: dict[str, Any]) -> Next | Done:
    gate = ctx.input["gate"]
    wait_for(ctx, gate + ".ask")
    answer = ctx.ask(QUESTION, SCHEMA, expires_in=600)
    wait_for(ctx, gate + ".finish")
    return ctx.done({"decision": answer["decision"]})
