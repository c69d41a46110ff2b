"""Errors of the run store, each with a stable machine-readable ``code``.

The API maps them to ``application/problem+json`` with ``ERROR_STATUS[code]``; the
dashboard shows ``detail``. A service that raises one has changed nothing: it
raises before writing, inside the transaction that would have written.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class ErrorKind(NamedTuple):
    status: int  # the HTTP status the API answers with
    title: str  # the problem's title (RFC 9457): short, the same for every occurrence


# code -> status and title. The one table of problems: the services raise these codes, the
# API renders them (api/problems.py) and documents them (api/base.py).
ERRORS: dict[str, ErrorKind] = {
    "stale_after_cancel": ErrorKind(409, "Stale after cancel"),
    "stale_worker": ErrorKind(409, "Stale worker"),
    "request_mismatch": ErrorKind(409, "Request mismatch"),
    "stale_checkpoint": ErrorKind(409, "Stale checkpoint"),
    "request_expired": ErrorKind(409, "Request expired"),
    "invalid_state": ErrorKind(409, "Invalid state"),
    "retry_not_allowed": ErrorKind(409, "Retry not allowed"),
    "side_effect_unknown": ErrorKind(409, "Side effect unknown"),
    "approval_required": ErrorKind(409, "Approval required"),
    # A compensation would overwrite a change made after the effect (unless forced).
    "target_changed": ErrorKind(409, "Target changed since the effect"),
    # A fenced worker write from a token other than the one that claimed the attempt.
    "not_your_lease": ErrorKind(409, "Not your lease"),
    "idempotency_in_progress": ErrorKind(409, "Idempotent request in progress"),
    "idempotency_key_reused": ErrorKind(422, "Idempotency key reused"),
    "idempotency_key_missing": ErrorKind(400, "Idempotency key missing"),
    "idempotency_key_malformed": ErrorKind(400, "Idempotency key malformed"),
    "invalid_input": ErrorKind(422, "Invalid input"),
    "destination_not_allowed": ErrorKind(422, "Destination not allowed"),
    "unknown_agent": ErrorKind(422, "Unknown agent"),
    "not_found": ErrorKind(404, "Not found"),
    "permission_denied": ErrorKind(403, "Permission denied"),
    # Approving steps when a run is started is an approval: it needs runs.approve_run.
    "preapproval_not_permitted": ErrorKind(403, "Pre-approval not permitted"),
    # The approval's policy does not let this person decide it (not in its groups, no
    # self-approval, already approved); ``reason`` says which.
    "approval_not_allowed": ErrorKind(403, "Approval not allowed"),
    # A worker token asked to declare, claim or report on an agent it may not serve.
    "agent_not_yours": ErrorKind(403, "Not this worker token's agent"),
    "not_authenticated": ErrorKind(401, "Not authenticated"),
    "malformed_request": ErrorKind(400, "Malformed request"),
    "payload_too_large": ErrorKind(413, "Payload too large"),
    "method_not_allowed": ErrorKind(405, "Method not allowed"),
    # HTTP-level refusals of the API (api.problems renders every one as problem+json).
    "authentication_failed": ErrorKind(401, "Authentication failed"),
    "csrf_failed": ErrorKind(403, "CSRF check failed"),
    "not_acceptable": ErrorKind(406, "Not acceptable"),
    "unsupported_media_type": ErrorKind(415, "Unsupported media type"),
    "throttled": ErrorKind(429, "Too many requests"),
    "server_error": ErrorKind(500, "Server error"),
    # Past what the web process can serve (api/admission.py) or no pooled database
    # connection in time: nothing was done; send it again after Retry-After.
    "overloaded": ErrorKind(503, "Overloaded"),
}
ERROR_STATUS: dict[str, int] = {code: kind.status for code, kind in ERRORS.items()}


# Members of the problem+json body itself; an error's extra facts may not reuse them.
RESERVED_MEMBERS = frozenset({"type", "title", "status", "detail", "code", "instance"})


class HoldpointError(Exception):
    """A refused operation. ``extra`` carries structured facts for the client."""

    def __init__(self, code: str, detail: str, **extra: Any) -> None:
        if code not in ERROR_STATUS:
            raise ValueError(f"unknown error code {code!r}")
        clash = RESERVED_MEMBERS & extra.keys()
        if clash:
            # Caught here, at the source, rather than as a 500 when the API renders it.
            raise ValueError(f"extra facts may not be named {', '.join(sorted(clash))}")
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.extra = extra

    @property
    def status(self) -> int:
        return ERROR_STATUS[self.code]

    def __repr__(self) -> str:
        return f"HoldpointError({self.code!r}, {self.detail!r})"
