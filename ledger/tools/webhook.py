"""The webhook tool: an HTTP POST that carries the ``Idempotency-Key`` header.

It never retries on its own. A timeout or a dropped connection after the request
was sent means the receiver may have acted: that is ``OutcomeUnknown``, and the
ledger stops the run until the key is looked up or a person decides. Only what
certainly did not happen (connection refused, a 4xx refusal) is ``ActionFailed``.

Lookup is a configurable GET (``HOLDPOINT_WEBHOOK_LOOKUP_URL``, a template with
``{idempotency_key}``): 200 means the receiver has the delivery (a body with
``"status": "failed"`` says it was refused), 404 means it never arrived.

A POST cannot be taken back by us, so the tool is ``irreversible`` by default. An
agent may declare one call ``compensable`` by giving a compensating action
``{"url": …, "body": …}``: compensation POSTs it with its own idempotency key.

Every call (act, look-up, compensation) goes through ``ledger.outbound``: the
destination policy, the address pinned after the check, no ``Host`` or hop-by-hop
headers from agents, and limits on the reply. A refused destination is
``ActionFailed`` (``failed``): nothing was sent. Secret headers (``Authorization``,
cookies, API keys…) are sent as given but stored redacted, so a compensation run later
from the stored action goes without them, and a look-up sends none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from django.conf import settings

from ledger import outbound
from ledger.tools import ActionFailed, Outcome, OutcomeUnknown, ToolResult

# Answers after which the receiver may have acted although it did not say so: the work
# may be done before a 500, a gateway may time out (502/504) while the upstream goes
# on, 409/425 mean "the same key is still in progress", 408 that the receiver gave up
# reading. Everything else at 400 and above is a refusal: the action did not happen.
AMBIGUOUS_STATUSES = frozenset({408, 409, 425, 500, 502, 504})

# What ``ctx.side_effect("webhook", target, request)`` takes (docs/tools.md).
REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "url": {
            "type": "string",
            "minLength": 1,
            "maxLength": 2048,
            "description": "The http(s) URL the POST goes to.",
        },
        "body": {"description": "Any JSON value, sent as application/json (default {})."},
        "headers": {
            "type": "object",
            "maxProperties": 50,
            "description": "Extra request headers; secret ones are stored redacted.",
        },
    },
    "required": ["url"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class _Response:
    status: int
    body: Any
    headers: dict[str, str]
    truncated: bool = False


def _decode(raw: bytes, content_type: str) -> Any:
    text = raw.decode("utf-8", errors="replace")
    if "json" in content_type or text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


class WebhookTool:
    def __init__(
        self,
        *,
        name: str = "webhook",
        timeout: float | None = None,
        lookup_url: str | None = None,
        reversibility: str = "irreversible",
        reference_field: str = "id",
    ) -> None:
        self.name = name
        self.reversibility = reversibility
        self.reference_field = reference_field
        self.request_schema = REQUEST_SCHEMA
        self._timeout = timeout
        self._lookup_url = lookup_url

    @property
    def timeout(self) -> float:
        if self._timeout is not None:
            return self._timeout
        return float(getattr(settings, "HOLDPOINT_WEBHOOK_TIMEOUT_SECONDS", 10.0))

    @property
    def lookup_url(self) -> str:
        if self._lookup_url is not None:
            return self._lookup_url
        return str(getattr(settings, "HOLDPOINT_WEBHOOK_LOOKUP_URL", "") or "")

    @property
    def can_look_up(self) -> bool:
        return bool(self.lookup_url)

    # --- the protocol ---------------------------------------------------------------------

    def validate(self, request: Any) -> None:
        if not isinstance(request, dict):
            raise ActionFailed("A webhook request is an object with a url and a body.")
        outbound.check_request(request.get("url"), request.get("headers"))

    def validate_compensating_action(self, action: Any) -> None:
        """The compensating action is sent later by whoever compensates (the web process
        when a person does): its destination and headers are checked now, before the
        effect is written."""
        if not isinstance(action, dict) or not action.get("url"):
            raise ActionFailed("A webhook compensating action is an object with a url.")
        outbound.check_request(action.get("url"), action.get("headers"))

    def plan_compensation(self, request: Any) -> dict[str, Any] | None:
        return None

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        self.validate(request)
        response = self._send(
            "POST",
            request["url"],
            body=request.get("body", {}),
            idempotency_key=idempotency_key,
            headers=request.get("headers") or {},
        )
        return self._result(response, idempotency_key)

    def lookup(self, idempotency_key: str) -> Outcome | None:
        template = self.lookup_url
        if not template:
            raise OutcomeUnknown(
                "This webhook has no lookup URL (HOLDPOINT_WEBHOOK_LOOKUP_URL); it cannot tell."
            )
        url = template.format(idempotency_key=quote(idempotency_key, safe=""))
        try:
            response = self._send("GET", url, body=None, idempotency_key=idempotency_key)
        except ActionFailed as exc:
            if exc.details.get("status") == 404:
                return None
            raise OutcomeUnknown(f"The lookup was refused: {exc.message}") from exc
        body = response.body
        if isinstance(body, dict) and body.get("status") == "failed":
            return Outcome(status="failed", result=body, error=body.get("error"))
        result = self._result(response, idempotency_key)
        return Outcome(
            status="confirmed", external_reference=result.external_reference, result=result.result
        )

    def compensate(self, side_effect: Any) -> ToolResult:
        action = side_effect.compensating_action or {}
        if not isinstance(action, dict) or not action.get("url"):
            raise ActionFailed("This webhook call has no compensating action with a url.")
        body = action.get("body", {})
        if isinstance(body, dict):
            body = {
                **body,
                "compensates": {
                    "idempotency_key": side_effect.idempotency_key,
                    "external_reference": side_effect.external_reference,
                },
            }
        response = self._send(
            "POST",
            action["url"],
            body=body,
            idempotency_key=side_effect.compensation_idempotency_key,
            # The ledger stored the action with its secret headers redacted: the
            # placeholders are not sent (docs/security.md, "Secrets in webhook headers").
            headers=outbound.without_redacted(action.get("headers") or {}),
        )
        return self._result(response, side_effect.compensation_idempotency_key)

    # --- HTTP -------------------------------------------------------------------------------

    def _result(self, response: _Response, idempotency_key: str) -> ToolResult:
        body = response.body
        reference = self._reference_in(body)
        reference = (
            reference
            or response.headers.get("location", "")
            or response.headers.get("x-request-id", "")
            # The receiver knows the delivery by its key when it names nothing else.
            or idempotency_key
        )
        result: dict[str, Any] = {"status_code": response.status, "body": body}
        if response.truncated:
            result["body_truncated"] = True
        return ToolResult(external_reference=reference[:500], result=result)

    def _reference_in(self, body: Any) -> str:
        """The receiver's name for the delivery: ``reference_field`` of the answer, or of
        the ``response`` it wraps (a look-up that answers with the delivery's record and
        the answer the POST got), so that a look-up finds the reference the POST gave."""
        if not isinstance(body, dict):
            return ""
        for candidate in (body, body.get("response")):
            if isinstance(candidate, dict) and candidate.get(self.reference_field) not in (
                None,
                "",
            ):
                return str(candidate[self.reference_field])
        return ""

    def _send(
        self,
        method: str,
        url: str,
        *,
        body: Any,
        idempotency_key: str,
        headers: dict[str, str] | None = None,
    ) -> _Response:
        all_headers = {"User-Agent": "Holdpoint-webhook/1", "Accept": "application/json"}
        all_headers.update(outbound.check_headers(headers or {}))
        # Our key always wins over one the request may carry: it is what the ledger recorded.
        all_headers["Idempotency-Key"] = idempotency_key
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            all_headers["Content-Type"] = "application/json"
        reply = outbound.send(method, url, headers=all_headers, body=data, timeout=self.timeout)
        status, response_headers = reply.status, reply.headers
        raw = reply.body
        decoded = _decode(raw, response_headers.get("content-type", ""))
        if 200 <= status < 300:
            return _Response(
                status=status, body=decoded, headers=response_headers, truncated=reply.truncated
            )
        details = {"status": status, "body": decoded, "url": url}
        if status in AMBIGUOUS_STATUSES or 300 <= status < 400:
            raise OutcomeUnknown(f"{method} {url} answered {status}; it may have acted.", **details)
        raise ActionFailed(f"{method} {url} was refused with {status}.", **details)
