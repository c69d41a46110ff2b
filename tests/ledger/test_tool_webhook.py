"""The webhook tool against a real HTTP server on the loopback interface."""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import pytest

from ledger.tools import ActionFailed, OutcomeUnknown, get_tool
from ledger.tools.webhook import WebhookTool
from tests.ledger.conftest import Receiver


def test_it_posts_with_the_idempotency_key_and_returns_the_receivers_reference(
    receiver: Receiver,
) -> None:
    tool = get_tool("webhook")
    done = tool.execute(
        {"url": receiver.url(), "body": {"version": 42}, "headers": {"Idempotency-Key": "forged"}},
        "key-1",
    )
    assert done.external_reference == "dlv_1"
    assert done.result["status_code"] == 201
    assert receiver.performed["key-1"] == 1 and "forged" not in receiver.received
    assert receiver.bodies["key-1"] == {"version": 42}


def test_a_repeat_with_the_same_key_is_not_a_second_delivery(receiver: Receiver) -> None:
    tool = get_tool("webhook")
    first = tool.execute({"url": receiver.url(), "body": {}}, "key-1")
    second = tool.execute({"url": receiver.url(), "body": {}}, "key-1")
    assert first.external_reference == second.external_reference == "dlv_1"
    assert receiver.received["key-1"] == 2
    assert receiver.performed["key-1"] == 1


def test_a_timeout_is_unknown_and_is_never_retried_silently(receiver: Receiver) -> None:
    receiver.mode = "slow"
    started = time.monotonic()
    with pytest.raises(OutcomeUnknown):
        get_tool("webhook").execute({"url": receiver.url(), "body": {}}, "key-slow")
    assert time.monotonic() - started < 0.9  # gave up at the timeout, did not wait it out
    assert receiver.received["key-slow"] == 1
    # The slow receiver still did the work: exactly why the outcome is "unknown".
    receiver.wait_performed("key-slow")


def test_a_refusal_is_a_failure(receiver: Receiver) -> None:
    receiver.mode = "reject"
    with pytest.raises(ActionFailed) as exc:
        get_tool("webhook").execute({"url": receiver.url(), "body": {}}, "key-r")
    assert exc.value.details["status"] == 422
    assert receiver.performed["key-r"] == 0


def test_a_server_error_is_unknown_because_the_work_may_be_done(receiver: Receiver) -> None:
    receiver.mode = "error"
    with pytest.raises(OutcomeUnknown) as exc:
        get_tool("webhook").execute({"url": receiver.url(), "body": {}}, "key-e")
    assert exc.value.details["status"] == 500


def test_a_refused_connection_is_a_failure_because_nothing_was_sent() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port now.
    with pytest.raises(ActionFailed):
        WebhookTool(timeout=1).execute({"url": f"http://127.0.0.1:{port}/x", "body": {}}, "k")


def test_it_looks_a_key_up_by_the_configured_get(receiver: Receiver) -> None:
    tool = get_tool("webhook")
    assert tool.lookup("key-1") is None
    tool.execute({"url": receiver.url(), "body": {}}, "key/with spaces")
    outcome = tool.lookup("key/with spaces")
    assert outcome is not None
    assert (outcome.status, outcome.external_reference) == ("confirmed", "dlv_1")
    assert receiver.lookups["key/with spaces"] == 1


def test_without_a_lookup_url_it_cannot_tell(settings) -> None:
    settings.HOLDPOINT_WEBHOOK_LOOKUP_URL = ""
    tool = get_tool("webhook")
    assert tool.can_look_up is False  # type: ignore[attr-defined]
    with pytest.raises(OutcomeUnknown):
        tool.lookup("key-1")


def test_it_refuses_requests_it_can_never_send() -> None:
    tool = WebhookTool()
    for request in ({"body": {}}, {"url": "ftp://x/y"}, {"url": "http:///nohost"}, []):
        with pytest.raises(ActionFailed):
            tool.validate(request)


def test_it_compensates_with_the_given_action_under_its_own_key(receiver: Receiver) -> None:
    tool = get_tool("webhook")
    effect = SimpleNamespace(
        idempotency_key="key-1",
        external_reference="dlv_1",
        compensation_idempotency_key="key-1.undo",
        compensating_action={"url": receiver.url("/hooks/rollback"), "body": {"to": 41}},
    )
    done = tool.compensate(effect)  # type: ignore[attr-defined]
    assert done.external_reference == "dlv_1"
    assert receiver.bodies["key-1.undo"] == {
        "to": 41,
        "compensates": {"idempotency_key": "key-1", "external_reference": "dlv_1"},
    }
    effect.compensating_action = None
    with pytest.raises(ActionFailed):
        tool.compensate(effect)  # type: ignore[attr-defined]
