"""Invoice chaser: an agent written from docs/agents.md alone (issue 19).

It looks a customer up, asks a person which tone the reminder takes (``ctx.choose``: one
of three, three buttons on the card), tells the billing system through a webhook and
e-mails the customer, both through the ledger (both irreversible: each is approved
first). Its input is a dataclass (``Chase``). Its tests
(``tests/runtime/test_invoice_chaser.py``) use the harness, ``runtime.testing``.

Start it with ``{"invoice": "INV-7", "customer": "acme", "billing_url":
"http://127.0.0.1:8765/hooks/billing"}`` (the demo receiver of ``make run``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from runtime.sdk import Agent, Context, Deterministic, Done, Next, RetryPolicy


@dataclass
class Chase:
    """Which invoice to chase, whose, and where the billing system listens."""

    invoice: Annotated[str, {"minLength": 1, "maxLength": 40}]
    customer: Annotated[str, {"minLength": 1, "maxLength": 40}]
    billing_url: Annotated[
        str,
        {
            "format": "uri",
            "pattern": r"https?://\S+",
            "description": "The billing system's webhook (an http or https URL)",
        },
    ]


agent = Agent(
    name="invoice-chaser",
    label="Chase {invoice}",
    description="Reminds a customer of an unpaid invoice in the tone a person picks.",
    input_schema=Chase,  # ctx.input is a Chase
    retry=RetryPolicy(max_attempts=4, backoff_initial=30.0, non_retryable=("UnknownCustomer",)),
    tools=("webhook", "email"),
)

TONES = {"friendly": "Friendly", "firm": "Firm", "final": "Final notice"}

# A stand-in for the CRM the agent would ask.
CUSTOMERS: dict[str, dict[str, Any]] = {
    "acme": {"name": "Acme Ltd", "email": "accounts@acme.example", "overdue_days": 21},
    "globex": {"name": "Globex", "email": "ap@globex.example", "overdue_days": 64},
}


class UnknownCustomer(Exception):
    """The CRM has no such customer: retrying cannot help (``non_retryable``)."""


def find_customer(customer_id: str) -> dict[str, Any] | None:
    found = CUSTOMERS.get(customer_id)
    return dict(found) if found is not None else None


@agent.step("look_up", start=True)
def look_up(ctx: Context, state: dict[str, Any]) -> Next | Done:
    customer = ctx.observe("customer", find_customer, ctx.input.customer)
    if customer is None:
        raise UnknownCustomer(f"no customer {ctx.input.customer!r}")
    ctx.log(f"{customer['name']} is {customer['overdue_days']} days overdue")
    return ctx.next("pick_tone", {"customer": customer})


@agent.step("pick_tone")
def pick_tone(ctx: Context, state: dict[str, Any]) -> Next | Done:
    customer = state["customer"]
    tone = ctx.choose(
        f"Which tone for the reminder to {customer['name']} ({customer['overdue_days']} days)?",
        TONES,
        expires_in=24 * 3600,
    )
    return ctx.next("send", {**state, "tone": tone})


@agent.step("send")
def send(ctx: Context, state: dict[str, Any]) -> Next | Done:
    customer, tone = state["customer"], state["tone"]
    if tone not in TONES:
        raise Deterministic(f"unknown tone {tone!r}")
    invoice = ctx.input.invoice
    billing = ctx.side_effect(
        "webhook",
        "billing system",
        {"url": ctx.input.billing_url, "body": {"invoice": invoice, "reminder": tone}},
        key="billing",
    )
    notice = ctx.side_effect(
        "email",
        customer["email"],
        {
            "to": customer["email"],
            "subject": f"Invoice {invoice}" + (": final notice" if tone == "final" else ""),
            "body": f"Dear {customer['name']}, invoice {invoice} is "
            f"{customer['overdue_days']} days overdue ({tone} reminder).",
        },
        key="notice",
    )
    return ctx.done(
        {
            "invoice": invoice,
            "tone": tone,
            "billing_reference": billing.external_reference,
            "message_id": notice.external_reference,
        }
    )
