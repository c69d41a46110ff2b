"""Nightly report: a transient failure with a long backoff, to watch a run wait.

The upstream API answers "429 rate limited" on the first attempt. That is a passing
(transient) error, so the run goes to *Backing off* and the dashboard shows when the
next attempt is due (``backoff_initial`` is five minutes). The next attempt goes on
from the checkpoint after ``collect`` and succeeds.
"""

from __future__ import annotations

from typing import Any

from runtime.sdk import Agent, Context, Done, Next, RetryPolicy

agent = Agent(
    name="nightly-report",
    label="Nightly report {day}",
    description="Builds a usage report; the upstream API rate-limits the first attempt, "
    "so the run backs off for five minutes before it tries again.",
    input_schema={
        "type": "object",
        "properties": {"day": {"type": "string", "format": "date"}},
        "additionalProperties": False,
    },
    retry=RetryPolicy(max_attempts=4, backoff_initial=300.0, backoff_max=1800.0, jitter=0.1),
)


class RateLimited(Exception):
    """The upstream API answered 429: try again later."""


@agent.step("collect", start=True)
def collect(ctx: Context, state: dict[str, Any]) -> Next | Done:
    ctx.log("collected 1,204 usage rows")
    return ctx.next("publish", {"rows": 1204})


@agent.step("publish")
def publish(ctx: Context, state: dict[str, Any]) -> Next | Done:
    if ctx.attempt_number == 1:
        raise RateLimited("upstream API answered 429 rate limited; retry after 300 s")
    return ctx.done({"rows": state["rows"], "published": True})
