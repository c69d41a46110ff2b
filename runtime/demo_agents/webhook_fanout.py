"""Webhook fan-out: several webhooks, one of which times out.

Each subscriber gets a POST through ``ctx.side_effect("webhook", …)`` with its own key
(``fan_out.notify-<name>``) and a compensating action (a retraction POST), which makes
each call ``compensable`` rather than irreversible, so no approval is needed.

The subscriber named in ``slow`` takes longer than the webhook tool's timeout
(``HOLDPOINT_WEBHOOK_TIMEOUT_SECONDS``): the sender cannot tell whether it arrived, so
the ledger records ``unknown`` and the run stops (``side_effect_unknown``). Then:

- the reconciler looks the key up (``HOLDPOINT_WEBHOOK_LOOKUP_URL``) once the settle
  time has passed, or a person reconciles it (``POST /api/side-effects/{op}/reconcile``);
- a retry runs the step again: the deliveries already confirmed are reused, not sent
  again; only what did not happen is sent, with the same key as before.

Run ``python manage.py demoreceiver`` for a receiver on http://127.0.0.1:8765 (and the
workers with ``HOLDPOINT_OUTBOUND_ALLOW_LOCAL=true``: loopback is refused by default).
"""

from __future__ import annotations

from typing import Any

from runtime.sdk import Agent, Context, Done, Next, RetryPolicy

agent = Agent(
    name="webhook-fanout",
    description="Notifies several webhook subscribers; one is slow and times out, so the "
    "ledger records an unknown outcome that must be reconciled before a retry.",
    input_schema={
        "type": "object",
        "properties": {
            "base_url": {"type": "string", "pattern": "^https?://"},
            "event": {"type": "string", "minLength": 1},
            "subscribers": {
                "type": "array",
                "items": {"type": "string", "pattern": "^[a-z0-9-]+$"},
                "minItems": 1,
                "maxItems": 20,
            },
            "slow": {"type": "string"},
            "slow_seconds": {"type": "number", "minimum": 0, "maximum": 60},
        },
        "required": ["base_url"],
        "additionalProperties": False,
    },
    retry=RetryPolicy(max_attempts=3, backoff_initial=1.0),
    tools=("webhook",),
)


@agent.step("prepare", start=True)
def prepare(ctx: Context, state: dict[str, Any]) -> Next | Done:
    payload = {"event": ctx.input.get("event", "deploy.finished"), "run_id": ctx.run_id}
    subscribers = ctx.input.get("subscribers", ["billing", "search", "analytics"])
    return ctx.next("fan_out", {"payload": payload, "subscribers": subscribers})


@agent.step("fan_out")
def fan_out(ctx: Context, state: dict[str, Any]) -> Next | Done:
    base = ctx.input["base_url"].rstrip("/")
    slow = ctx.input.get("slow", "analytics")
    delivered: dict[str, str] = {}
    for name in state["subscribers"]:
        url = f"{base}/hooks/{name}"
        if name == slow:
            url += f"?delay={ctx.input.get('slow_seconds', 15)}"
        sent = ctx.side_effect(
            "webhook",
            url,
            {"url": url, "body": state["payload"]},
            compensate={"url": f"{base}/hooks/{name}/retract", "body": state["payload"]},
            key=f"notify-{name}",
        )
        delivered[name] = sent.external_reference
        ctx.log(f"{name}: {sent.decision} ({sent.external_reference})")
    return ctx.done({"delivered": delivered})
