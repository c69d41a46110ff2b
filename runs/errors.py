"""Errors of the run store, each with a stable machine-readable ``code``.

The API maps them to ``application/problem+json`` with ``ERROR_STATUS[code]``; the
dashboard shows ``detail``. A service that raises one has changed nothing: it
raises before writing, inside the transaction that would have written.
"""

from __future__ import annotations

from typing import Any

# code -> HTTP status. One table, so the API and the docs cannot disagree.
ERROR_STATUS: dict[str, int] = {
    "stale_after_cancel": 409,
    "stale_worker": 409,
    "request_mismatch": 409,
    "stale_checkpoint": 409,
    "request_expired": 409,
    "invalid_state": 409,
    "retry_not_allowed": 409,
    "side_effect_unknown": 409,
    "approval_required": 409,
    "target_changed": 409,
    "idempotency_in_progress": 409,
    "idempotency_key_reused": 422,
    "idempotency_key_missing": 400,
    "idempotency_key_malformed": 400,
    "invalid_input": 422,
    "unknown_agent": 422,
    "not_found": 404,
    "permission_denied": 403,
    "not_authenticated": 401,
    "malformed_request": 400,
    "payload_too_large": 413,
    "method_not_allowed": 405,
    # HTTP-level refusals of the API (runs.problems renders every one as problem+json).
    "authentication_failed": 401,
    "csrf_failed": 403,
    "not_acceptable": 406,
    "unsupported_media_type": 415,
    "throttled": 429,
    "server_error": 500,
}


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
