"""Issue 19, point 1: every shipped tool documents its request (docs/tools.md), the ledger
checks each request against the tool's schema with a pointer per mistake before anything is
written, and a look-up after a crash records the reference the delivery itself got."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.tools import get_tool, registered_tools, request_errors
from runs.errors import HoldpointError
from tests.api.conftest import post
from tests.ledger.conftest import Receiver
from tests.ledger.helpers import begin, crash, hook
from tests.ledger.test_api import begin_body, begin_url, http_claim
from tests.ledger.test_api import wclient as wclient  # the fixture
from tests.runs.factory import claim, start

pytestmark = pytest.mark.django_db

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tools.md"


def test_every_shipped_tool_has_a_schema_and_a_section_in_the_docs() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for tool in registered_tools():
        if tool.name not in ("webhook", "email", "config_store"):
            continue  # a test's own tool
        assert isinstance(tool.request_schema, dict), tool.name  # type: ignore[attr-defined]
        assert f"## `{tool.name}`" in text
        for field in tool.request_schema["properties"]:  # type: ignore[attr-defined]
            assert f"`{field}`" in text, (tool.name, field)
        for heading in ("Reference", "Result", "Reversibility", "Undo"):
            assert f"**{heading}**" in text


@pytest.mark.parametrize(
    ("tool", "request_", "pointers"),
    [
        # The guess the issue made: {url, payload} instead of {url, body}.
        ("webhook", {"url": "http://127.0.0.1:9/x", "payload": {}}, ["/"]),
        ("webhook", {"body": {}}, ["/url"]),
        ("email", {"to": "ops@example.com", "text": "hi"}, ["/", "/subject"]),
        ("email", {"to": "ops@example.com", "subject": ""}, ["/subject"]),
        ("email", {"to": ["ops@example.com", 7], "subject": "s"}, ["/to"]),
        ("config_store", {"document": "staging/auth/config"}, ["/content"]),
    ],
)
def test_a_request_that_breaks_the_schema_is_refused_with_pointers_and_nothing_is_written(
    tool: str, request_: dict[str, Any], pointers: list[str]
) -> None:
    start()
    lease = claim()
    with pytest.raises(HoldpointError) as refused:
        begin(lease, tool=tool, request=request_)
    assert refused.value.code == "invalid_input"
    assert "docs/tools.md" in refused.value.detail
    assert [e["pointer"] for e in refused.value.extra["errors"]] == pointers
    assert all(e["message"] for e in refused.value.extra["errors"])
    assert not SideEffect.objects.exists()


def test_the_documented_requests_pass_the_schema() -> None:
    assert request_errors(get_tool("webhook"), {"url": "https://x.example/h", "body": [1]}) == []
    assert request_errors(get_tool("webhook"), {"url": "https://x.example/h"}) == []
    assert (
        request_errors(
            get_tool("email"),
            {"to": ["a@example.com"], "cc": "b@example.com", "subject": "s", "body": "b"},
        )
        == []
    )
    assert request_errors(get_tool("config_store"), {"document": "a/b", "content": None}) == []


def _crash_after_act(receiver: Receiver) -> tuple[Any, str]:
    """The worker writes the intent, the receiver gets the POST, the worker dies before it
    records the outcome; a new attempt looks the key up."""
    start(approvals=["notify"])
    lease = claim()
    first = begin(lease, request=hook(receiver))
    delivered = get_tool("webhook").execute(hook(receiver), first.idempotency_key)
    lease2 = crash(lease)
    again = begin(lease2, request=hook(receiver))
    assert again.decision == "look_up"
    found = ledger.side_effect_look_up(
        operation_id=again.operation_id,
        lease_epoch=lease2.lease_epoch,
        cancel_epoch=lease2.cancel_epoch,
    )
    assert found.outcome == "confirmed"
    return found.side_effect, delivered.external_reference


def test_a_look_up_records_the_reference_the_delivery_got(receiver: Receiver) -> None:
    effect, delivered = _crash_after_act(receiver)
    assert delivered == "dlv_1"
    assert (effect.status, effect.external_reference) == ("confirmed", "dlv_1")
    assert receiver.performed == {effect.idempotency_key: 1}


def test_a_look_up_that_wraps_the_posts_answer_finds_its_reference_too(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A receiver whose look-up answers with its own record of the delivery and, inside it,
    # the answer the POST got (docs/tools.md): the reference is the POST's, not the key.
    plain = receiver.handle_lookup

    def wrapped(key: str) -> tuple[int, dict[str, Any]]:
        status, payload = plain(key)
        return status, ({"status": "delivered", "response": payload} if status == 200 else payload)

    monkeypatch.setattr(receiver, "handle_lookup", wrapped)
    effect, delivered = _crash_after_act(receiver)
    assert effect.external_reference == delivered == "dlv_1"
    assert effect.idempotency_key != "dlv_1"


def test_the_ledger_keeps_the_first_confirmed_reference(receiver: Receiver) -> None:
    start(approvals=["notify"])
    lease = claim()
    first = begin(lease, request=hook(receiver))
    ledger.side_effect_record_outcome(
        operation_id=first.operation_id, status="confirmed", external_reference="dlv_1"
    )
    later = ledger.side_effect_record_outcome(
        operation_id=first.operation_id,
        status="confirmed",
        external_reference=first.idempotency_key,
    )
    assert later.external_reference == "dlv_1"
    assert SideEffect.objects.get(pk=first.operation_id).external_reference == "dlv_1"


def test_the_worker_api_points_into_the_request_it_was_sent(
    receiver: Receiver, wclient: APIClient
) -> None:
    start(approvals=["deploy"])
    lease = http_claim(wclient)
    body = begin_body(lease, receiver, request={"body": {}, "payload": 1})
    refused = post(wclient, begin_url(lease), body, key=None)
    assert refused.status_code == 422
    problem = refused.json()
    assert problem["code"] == "invalid_input"
    assert [e["pointer"] for e in problem["errors"]] == ["/request", "/request/url"]
    assert not SideEffect.objects.exists()
