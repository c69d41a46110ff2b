"""The chaos harness's remote agent: written against ``holdpoint_client`` only and served
by ``holdpoint-worker`` processes, which the harness kills and freezes like the others.

``chaos-remote`` asks a question, then posts to the receiver through the ledger (the
webhook is irreversible: an approval first, which the harness's people give or refuse),
so the same invariants (one delivery per key, fenced writes, no two live leases) are
checked across the HTTP worker protocol.
"""

from __future__ import annotations

import os
from typing import Any

from holdpoint_client import Agent, Context, Done, Next, RetryPolicy, WebhookTool

remote = Agent(
    name="chaos-remote",
    input_schema={"hook_url": "string"},
    description="Remote agent (Python client) of the chaos harness",
    tools=[WebhookTool(lookup_url=os.environ.get("HOLDPOINT_WEBHOOK_LOOKUP_URL", ""), timeout=2.0)],
    retry=RetryPolicy(max_attempts=8, backoff_initial=0.2, backoff_max=2.0),
)


@remote.step(start=True)
def ask(ctx: Context, state: dict[str, Any]) -> Next:
    note = ctx.ask("A note for the delivery?", {"note": "string"})
    return ctx.next("deliver", {"note": note["note"]})


@remote.step
def deliver(ctx: Context, state: dict[str, Any]) -> Done:
    sent = ctx.side_effect(
        "webhook",
        "chaos receiver",
        {"url": ctx.input["hook_url"], "body": {"run": ctx.run_id, "note": state["note"]}},
    )
    return ctx.done({"delivery": sent.external_reference})


AGENTS = [remote]
