"""The e-mail tool through Django's mail framework (the locmem backend in tests)."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.tools import ActionFailed, OutcomeUnknown, can_compensate, get_tool
from ledger.tools.mail import message_id_for


def test_it_sends_with_a_message_id_derived_from_the_key(mailbox: list[Any]) -> None:
    tool = get_tool("email")
    done = tool.execute(
        {"to": "ops@example.com", "subject": "Token 版本已轮换", "body": "v1 → v2"}, "key-1"
    )
    assert len(mailbox) == 1
    message = mailbox[0]
    assert message.to == ["ops@example.com"]
    assert message.subject == "Token 版本已轮换"
    assert message.extra_headers["Message-ID"] == done.external_reference
    assert done.external_reference == message_id_for("key-1")
    assert message_id_for("key-1") != message_id_for("key-2")
    assert message.message()["X-Idempotency-Key"] == "key-1"


def test_it_is_irreversible_and_cannot_be_looked_up() -> None:
    tool = get_tool("email")
    assert tool.reversibility == "irreversible"
    assert not can_compensate(tool)
    with pytest.raises(OutcomeUnknown):
        tool.lookup("key-1")


@pytest.mark.parametrize(
    "request_",
    [
        {"subject": "s", "body": "b"},
        {"to": "not-an-address", "subject": "s"},
        {"to": ["a@example.com"], "subject": " "},
        {"to": ["a@example.com"], "subject": "s", "body": 3},
    ],
)
def test_it_refuses_a_message_it_cannot_send(request_: dict[str, Any], mailbox: list[Any]) -> None:
    with pytest.raises(ActionFailed):
        get_tool("email").execute(request_, "key-1")
    assert mailbox == []


def test_a_refusing_mail_server_is_a_failure(settings: Any) -> None:
    # A real SMTP connection to a port where nothing listens: nothing was handed over.
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", port, 2
    with pytest.raises(ActionFailed):
        get_tool("email").execute({"to": "a@example.com", "subject": "s", "body": ""}, "k")
