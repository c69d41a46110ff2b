"""The e-mail tool: Django's mail framework (console or file backend locally, SMTP in
production). A sent message cannot be taken back, so the tool is ``irreversible``
and every use needs an approval first.

The Message-ID is derived from the idempotency key, so the recipient's mail system
(and a person reconciling) can tell duplicates apart. A mail server cannot be asked
later whether it accepted a message, so ``lookup`` can never tell: a message whose
outcome is lost stays ``unknown`` until a person reconciles it.
"""

from __future__ import annotations

import hashlib
import smtplib
import socket
from typing import Any

from django.conf import settings
from django.core.mail import BadHeaderError, EmailMessage

from ledger.tools import ActionFailed, Outcome, OutcomeUnknown, ToolResult

# SMTP answers that mean the server did not take the message.
_REFUSED = (
    smtplib.SMTPRecipientsRefused,
    smtplib.SMTPSenderRefused,
    smtplib.SMTPDataError,
    smtplib.SMTPAuthenticationError,
    smtplib.SMTPConnectError,
    smtplib.SMTPHeloError,
    smtplib.SMTPNotSupportedError,
    ConnectionRefusedError,
    socket.gaierror,
)


def message_id_for(idempotency_key: str) -> str:
    domain = settings.DEFAULT_FROM_EMAIL.rpartition("@")[2].strip(" >") or "holdpoint.localhost"
    digest = hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]
    return f"<{digest}@{domain}>"


def _no_line_breaks(value: str, what: str) -> str:
    # A line break in a header would start a new header (or the body): refuse it here so
    # that the request is refused before anything is written or sent.
    if "\r" in value or "\n" in value or "\x00" in value:
        raise ActionFailed(f"{what} must be one line: no line breaks.")
    return value


def _addresses(value: Any, what: str, *, required: bool = False) -> list[str]:
    if value is None or value == []:
        if required:
            raise ActionFailed(f"An e-mail needs at least one {what} address.")
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(a, str) and "@" in a for a in value):
        raise ActionFailed(f"{what} must be an address or a list of addresses.")
    return [_no_line_breaks(address, what) for address in value]


_ADDRESSES: dict[str, Any] = {
    "oneOf": [
        {"type": "string", "minLength": 3, "maxLength": 320},
        {
            "type": "array",
            "items": {"type": "string", "minLength": 3, "maxLength": 320},
            "maxItems": 100,
        },
    ]
}

# What ``ctx.side_effect("email", target, request)`` takes (docs/tools.md).
REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "to": {**_ADDRESSES, "description": "An address or a list of addresses."},
        "cc": _ADDRESSES,
        "bcc": _ADDRESSES,
        "subject": {"type": "string", "minLength": 1, "maxLength": 998},
        "body": {"type": "string", "maxLength": 1_000_000, "description": "Plain text."},
        "from": {"type": "string", "minLength": 3, "maxLength": 320},
    },
    "required": ["to", "subject"],
    "additionalProperties": False,
}


class EmailTool:
    name = "email"
    request_schema = REQUEST_SCHEMA
    reversibility = "irreversible"
    can_look_up = False
    # What an approver may edit before approving a message (the card's form: a simpler
    # shape than ``request_schema``, which the edited request must still fit, and the
    # tool's own ``validate`` checks before anything is written).
    edit_schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "to": {
                "type": "array",
                "title": "To",
                "items": {"type": "string", "format": "email", "maxLength": 254},
                "minItems": 1,
                "maxItems": 50,
            },
            "subject": {"type": "string", "title": "Subject", "minLength": 1, "maxLength": 500},
            "body": {"type": "string", "title": "Body", "maxLength": 20000},
        },
        "required": ["to", "subject"],
    }

    def __init__(self, *, name: str = "email") -> None:
        self.name = name

    def validate(self, request: Any) -> None:
        if not isinstance(request, dict):
            raise ActionFailed("An e-mail request is {to, subject, body}.")
        _addresses(request.get("to"), "to", required=True)
        _addresses(request.get("cc"), "cc")
        _addresses(request.get("bcc"), "bcc")
        if not isinstance(request.get("subject"), str) or not request["subject"].strip():
            raise ActionFailed("An e-mail needs a subject.")
        _no_line_breaks(request["subject"], "subject")
        sender = request.get("from")
        if sender is not None and (not isinstance(sender, str) or "@" not in sender):
            raise ActionFailed("from must be an address.")
        if sender is not None:
            _no_line_breaks(sender, "from")
        if not isinstance(request.get("body", ""), str):
            raise ActionFailed("body must be text.")

    def plan_compensation(self, request: Any) -> dict[str, Any] | None:
        return None

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        self.validate(request)
        message_id = message_id_for(idempotency_key)
        to = _addresses(request["to"], "to", required=True)
        message = EmailMessage(
            subject=request["subject"],
            body=request.get("body", ""),
            from_email=request.get("from") or settings.DEFAULT_FROM_EMAIL,
            to=to,
            cc=_addresses(request.get("cc"), "cc"),
            bcc=_addresses(request.get("bcc"), "bcc"),
            headers={"Message-ID": message_id, "X-Idempotency-Key": idempotency_key},
        )
        try:
            sent = message.send(fail_silently=False)
        except _REFUSED as exc:
            raise ActionFailed(f"The mail server did not take the message: {exc}") from exc
        except (BadHeaderError, ValueError) as exc:
            # The message could not be built (a header Django refuses): nothing was sent.
            raise ActionFailed(f"The message could not be built: {exc}") from exc
        except (smtplib.SMTPException, OSError) as exc:
            # A dropped connection or a timeout during or after DATA: it may have been sent.
            raise OutcomeUnknown(f"Sending was interrupted: {exc}") from exc
        if sent != 1:
            raise ActionFailed("The mail backend sent nothing.")
        return ToolResult(
            external_reference=message_id,
            result={"message_id": message_id, "to": to, "subject": request["subject"]},
        )

    def lookup(self, idempotency_key: str) -> Outcome | None:
        raise OutcomeUnknown(
            "A mail server cannot be asked whether it accepted a message; a person must check."
        )
