"""Tools run in the agent's process; the server's ledger decides whether they act.

A tool is any object with ``name``, ``reversibility`` (``reversible``, ``compensable``
or ``irreversible``), ``execute(request, idempotency_key) -> ToolResult`` and
``lookup(idempotency_key) -> Outcome | None`` (None: the external system has no record,
so the action did not happen), and optionally ``compensate(effect) -> ToolResult``.
``execute`` and ``lookup`` raise ``OutcomeUnknown`` when they cannot tell whether the
action happened and ``ActionFailed`` when it certainly did not.

``WebhookTool`` is built in: an HTTP POST carrying the ``Idempotency-Key`` header, looked
up with a GET on ``lookup_url`` (a template with ``{idempotency_key}``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import quote

import httpx

REVERSIBILITIES = ("reversible", "compensable", "irreversible")


@dataclass(frozen=True)
class ToolResult:
    external_reference: str
    result: Any = None


@dataclass(frozen=True)
class Outcome:
    status: Literal["confirmed", "failed"]
    external_reference: str = ""
    result: Any = None
    error: Any = None


class ToolError(Exception):
    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def as_error(self) -> dict[str, Any]:
        error: dict[str, Any] = {"type": type(self).__name__, "message": self.message[:2000]}
        if self.details:
            error["details"] = json.loads(json.dumps(self.details, default=str))
        return error


class OutcomeUnknown(ToolError):
    """The action may or may not have happened."""


class ActionFailed(ToolError):
    """The action certainly did not happen."""


@runtime_checkable
class Tool(Protocol):
    name: str
    reversibility: str

    def execute(self, request: Any, idempotency_key: str) -> ToolResult: ...

    def lookup(self, idempotency_key: str) -> Outcome | None: ...


# Answers after which the receiver may have acted although it did not say so.
AMBIGUOUS_STATUSES = frozenset({408, 409, 425, 500, 502, 504})


class WebhookTool:
    """POST ``request["body"]`` to ``request["url"]`` with the ledger's idempotency key.

    The server checks the destination against its outbound policy before the intent is
    written (``destination_not_allowed``); the POST itself is sent from this process.
    """

    def __init__(
        self,
        *,
        name: str = "webhook",
        lookup_url: str = "",
        timeout: float = 10.0,
        reversibility: str = "irreversible",
        reference_field: str = "id",
    ) -> None:
        self.name = name
        self.reversibility = reversibility
        self.lookup_url = lookup_url
        self.timeout = timeout
        self.reference_field = reference_field

    def execute(self, request: Any, idempotency_key: str) -> ToolResult:
        if not isinstance(request, dict) or not request.get("url"):
            raise ActionFailed("A webhook request is an object with a url and a body.")
        headers = {str(k): str(v) for k, v in (request.get("headers") or {}).items()}
        headers["Idempotency-Key"] = idempotency_key
        return self._result(
            self._send("POST", str(request["url"]), request.get("body", {}), headers),
            idempotency_key,
        )

    def lookup(self, idempotency_key: str) -> Outcome | None:
        if not self.lookup_url:
            raise OutcomeUnknown("This webhook has no lookup_url; it cannot tell.")
        url = self.lookup_url.format(idempotency_key=quote(idempotency_key, safe=""))
        try:
            response = self._send("GET", url, None, {"Idempotency-Key": idempotency_key})
        except ActionFailed as exc:
            if exc.details.get("status") == 404:
                return None
            raise OutcomeUnknown(f"The lookup was refused: {exc.message}") from exc
        body = _body(response)
        if isinstance(body, dict) and body.get("status") == "failed":
            return Outcome(status="failed", result=body, error=body.get("error"))
        result = self._result(response, idempotency_key)
        return Outcome(
            status="confirmed", external_reference=result.external_reference, result=result.result
        )

    def _send(self, method: str, url: str, body: Any, headers: dict[str, str]) -> httpx.Response:
        try:
            response = httpx.request(method, url, json=body, headers=headers, timeout=self.timeout)
        except httpx.ConnectError as exc:
            raise ActionFailed(f"{method} {url}: could not connect: {exc}") from exc
        except httpx.TransportError as exc:
            raise OutcomeUnknown(
                f"{method} {url}: {type(exc).__name__}; it may have acted."
            ) from exc
        status = response.status_code
        if 200 <= status < 300:
            return response
        details = {"status": status, "body": _body(response), "url": url}
        if status in AMBIGUOUS_STATUSES or 300 <= status < 400:
            raise OutcomeUnknown(f"{method} {url} answered {status}; it may have acted.", **details)
        raise ActionFailed(f"{method} {url} was refused with {status}.", **details)

    def _result(self, response: httpx.Response, idempotency_key: str) -> ToolResult:
        body = _body(response)
        reference = ""
        if isinstance(body, dict) and body.get(self.reference_field) not in (None, ""):
            reference = str(body[self.reference_field])
        reference = reference or response.headers.get("location", "") or idempotency_key
        return ToolResult(
            external_reference=reference[:500],
            result={"status_code": response.status_code, "body": body},
        )


def _body(response: httpx.Response) -> Any:
    text = response.text[:100_000]
    try:
        return json.loads(text)
    except ValueError:
        return text
