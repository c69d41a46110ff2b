"""The invoice chaser (``runtime/demo_agents/invoice_chaser.py``, written from
docs/agents.md alone) tested with the harness, ``runtime.testing.run_agent``: no server, no
database, the runtime's rules; then once for real on a worker."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.tools import ActionFailed
from runs import services
from runs.errors import HoldpointError
from runs.models import InputRequest
from runtime import registry
from runtime.demo_agents import invoice_chaser
from runtime.executor import Outcome
from runtime.testing import FakeTool, run_agent
from tests.ledger.conftest import Receiver
from tests.ledger.conftest import receiver as receiver  # the fixture
from tests.runtime.conftest import fresh, run_next

INPUT = {"invoice": "INV-7", "customer": "acme", "billing_url": "https://billing.example/hooks"}


def test_it_asks_for_a_tone_and_waits() -> None:
    run = run_agent(invoice_chaser.agent, INPUT)
    assert run.status == "input_required"
    assert run.pending is not None and "Acme Ltd" in run.pending.prompt
    assert run.pending.key == "pick_tone.choose"
    options = run.pending.schema["properties"]["choice"]["oneOf"]
    assert [o["const"] for o in options] == ["friendly", "firm", "final"]
    assert run.checkpoints == [
        ("look_up", {}),
        ("pick_tone", {"customer": invoice_chaser.CUSTOMERS["acme"]}),
    ]


def test_it_sends_the_webhook_and_the_email_once_each_after_their_approvals() -> None:
    hook, mail = (
        FakeTool("webhook", reversibility="irreversible"),
        FakeTool("email", reversibility="irreversible"),
    )
    run = run_agent(
        invoice_chaser.agent,
        INPUT,
        answers=["firm"],
        approvals=["approve", "approve"],
        tools={"webhook": hook, "email": mail},
    )
    assert run.status == "succeeded", run.error
    assert run.result == {
        "invoice": "INV-7",
        "tone": "firm",
        "billing_reference": "webhook-1",
        "message_id": "email-1",
    }
    assert [q.kind for q in run.questions] == ["input_required", "auth_required", "auth_required"]
    assert [q.key for q in run.questions] == ["pick_tone.choose", "send.billing", "send.notice"]
    assert [request for request, _ in hook.calls] == [
        {"url": INPUT["billing_url"], "body": {"invoice": "INV-7", "reminder": "firm"}}
    ]
    assert len(mail.calls) == 1 and mail.calls[0][0]["to"] == "accounts@acme.example"
    # The send step ran three times (two approvals), the webhook acted once, then was reused.
    assert run.steps_run.count("send") == 3
    assert run.side_effects["send.billing"].decisions == ["act", "reuse"]


def test_a_crash_between_the_webhooks_act_and_its_record_looks_it_up_and_never_sends_twice() -> (
    None
):
    hook = FakeTool("webhook", reversibility="irreversible", reference=lambda n, key: f"rcpt-{key}")
    run = run_agent(
        invoice_chaser.agent,
        INPUT,
        answers=["final"],
        approvals=["approve", "approve"],
        tools={"webhook": hook},
        crash_after="send.billing",
    )
    assert run.status == "succeeded", run.error
    effect = run.side_effects["send.billing"]
    assert len(hook.performed) == 1 and len(hook.calls) == 1
    assert hook.lookups == [effect.idempotency_key]
    assert effect.decisions == ["act", "look_up", "reuse"]
    # The reference after the look-up is the one the delivery got, not the key.
    assert run.result["billing_reference"] == f"rcpt-{effect.idempotency_key}"
    assert [a.status for a in run.attempts] == [
        "interrupted",
        "interrupted",
        "lost",
        "interrupted",
        "succeeded",
    ]
    assert run.attempts[3].reason == "lease_expired"


def test_a_crash_between_the_emails_act_and_its_record_stops_the_run_unknown() -> None:
    # E-mail cannot be looked up: nobody can tell whether the message went out.
    run = run_agent(
        invoice_chaser.agent,
        INPUT,
        answers=["friendly"],
        approvals=["approve", "approve"],
        crash_after="send.notice",
    )
    assert run.status == "failed"
    assert run.failure_class == "side_effect_unknown"
    assert len(run.tools["email"].calls) == 1
    assert run.side_effects["send.notice"].status == "unknown"
    assert run.side_effects["send.billing"].decisions == ["act", "reuse", "reuse"]


def test_a_crash_after_a_step_runs_the_step_again_from_its_checkpoint() -> None:
    run = run_agent(invoice_chaser.agent, INPUT, answers=["firm"], crash_after="look_up")
    assert run.status == "auth_required"
    assert run.steps_run[:2] == ["look_up", "look_up"]
    assert [c[0] for c in run.checkpoints] == ["look_up", "pick_tone", "send"]


def test_a_denied_webhook_fails_the_run_denied_and_sends_nothing() -> None:
    run = run_agent(
        invoice_chaser.agent,
        INPUT,
        answers=["firm"],
        approvals=[{"decision": "deny", "comment": "paid yesterday"}],
    )
    assert run.status == "failed" and run.failure_class == "denied"
    assert "paid yesterday" in run.error["message"]
    assert run.tools["webhook"].calls == [] and "email" not in run.tools


def test_a_refused_webhook_is_retried_with_backoff_and_the_same_key() -> None:
    hook = FakeTool(
        "webhook", reversibility="irreversible", fail=[ActionFailed("503 from billing")]
    )
    run = run_agent(
        invoice_chaser.agent,
        INPUT,
        answers=["firm"],
        approvals=["approve", "approve"],
        tools={"webhook": hook},
    )
    assert run.status == "succeeded", run.error
    assert [key for _, key in hook.calls] == [hook.calls[0][1]] * 2
    assert len(run.clock.backoffs) == 1 and 24.0 <= run.clock.backoffs[0] <= 30.0
    assert "auto_retry" in [a.reason for a in run.attempts]


def test_an_unknown_customer_stops_at_once() -> None:
    run = run_agent(invoice_chaser.agent, {**INPUT, "customer": "initech"})
    assert run.status == "failed" and run.failure_class == "deterministic"
    assert run.error["type"] == "UnknownCustomer" and len(run.attempts) == 1


def test_bad_input_is_refused_as_run_start_would() -> None:
    with pytest.raises(HoldpointError) as refused:
        run_agent(invoice_chaser.agent, {"invoice": "INV-7"})
    assert refused.value.code == "invalid_input"


# -- and for real: the run store, a worker, a webhook receiver, Django's mail outbox -------


@pytest.mark.django_db
def test_it_runs_for_real_on_a_worker(receiver: Receiver, mailoutbox: list[Any]) -> None:
    assert registry.get_agent("invoice-chaser") is invoice_chaser.agent  # a demo agent
    agent = invoice_chaser.agent
    run = services.run_start(agent=agent.name, input={**INPUT, "billing_url": receiver.url()})

    def answer(value: Any) -> InputRequest:
        request = fresh(run).pending_request
        services.run_resume(
            run_id=run.id, request_id=request.id, checkpoint_id=request.checkpoint_id, value=value
        )
        return request

    assert run_next(agent) == Outcome.INTERRUPTED
    asked = answer({"choice": "final"})
    assert asked.step_id == "pick_tone.choose"
    assert run_next(agent) == Outcome.INTERRUPTED
    assert answer({"decision": "approve"}).step_id == "send.billing"
    assert run_next(agent) == Outcome.INTERRUPTED
    assert answer({"decision": "approve"}).step_id == "send.notice"
    assert run_next(agent) == Outcome.SUCCEEDED
    result = fresh(run).result
    assert result["tone"] == "final" and result["billing_reference"] == "dlv_1"
    assert sum(receiver.performed.values()) == 1
    assert len(mailoutbox) == 1 and mailoutbox[0].subject == "Invoice INV-7: final notice"
    assert result["message_id"] == mailoutbox[0].extra_headers["Message-ID"]


@pytest.mark.django_db
def test_its_typed_input_is_a_form_on_the_dashboard(client: Any, operator: Any) -> None:
    client.force_login(operator)
    html = client.get("/runs/new?agent=invoice-chaser").content.decode()
    for field in ("invoice", "customer", "billing_url"):
        assert f'name="answer/{field}"' in html
    refused = client.post(
        "/runs/new",
        {
            "agent": "invoice-chaser",
            "idempotency_key": "chase-1",
            "answer/invoice": "INV-7",
            "answer/customer": "acme",
            "answer/billing_url": "not a url",
        },
    )
    assert refused.status_code == 422
    started = client.post(
        "/runs/new",
        {
            "agent": "invoice-chaser",
            "idempotency_key": "chase-2",
            "answer/invoice": "INV-7",
            "answer/customer": "acme",
            "answer/billing_url": "https://billing.example/hooks",
        },
    )
    assert started.status_code == 303
