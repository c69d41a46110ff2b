"""Pieces every API view shares: permission checks, input validation, schema documentation."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.exceptions import PermissionDenied
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.request import Request

from api.problems import CONTENT_TYPE
from api.serializers import ProblemSerializer
from runs.errors import ERROR_STATUS, HoldpointError
from runs.selectors import permission_denied_text
from runs.services import session_identity

# Refusals any authenticated endpoint can give, documented on every operation (a NUL
# character in the path or query is malformed_request wherever it is; a web process past
# its admission limit, or without a pooled connection in time, answers 503 overloaded).
AUTH_CODES = (
    "not_authenticated",
    "authentication_failed",
    "permission_denied",
    "csrf_failed",
    "throttled",
    "malformed_request",
    "overloaded",
)
# Refusals of any endpoint that reads a JSON body, before the view runs.
BODY_CODES = ("malformed_request", "payload_too_large", "unsupported_media_type", "invalid_input")


def api_identity(request: Request) -> str:
    """The credential a control-API request was made with, for the audit trail
    (``runs/audit.py``): the session's sign-in for a browser session (``session:oidc``, ``session:password``), ``token:<fingerprint>`` for a DRF
    token. A DRF token's key is its only id and a secret, so it is named by the first 12
    hex digits of its SHA-256 (``printf %s KEY | sha256sum`` finds it). Any other
    authenticator is named by its class, so a new one is never recorded as nothing."""
    authenticator = request.successful_authenticator
    if isinstance(request.auth, Token):
        fingerprint = hashlib.sha256(request.auth.key.encode()).hexdigest()[:12]
        return f"token:{fingerprint}"
    if isinstance(authenticator, SessionAuthentication):
        return session_identity(request.session)
    return type(authenticator).__name__ if authenticator is not None else ""


def require_perm(user: Any, perm: str) -> None:
    """Refuse with 403 unless ``user`` holds ``perm`` (collections: there is nothing to hide)."""
    if not user.has_perm(perm):
        raise PermissionDenied(permission_denied_text(perm))


def validated(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    """Validate ``data``; a failure is a 422 ``invalid_input`` listing each failing pointer."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


@contextmanager
def pointers_under(prefix: str) -> Iterator[None]:
    """Make the JSON pointers of a service's ``invalid_input`` point into the request body.

    Services check a value (an input, an answer) and point into it (``/n``); the API
    client sent that value as a member of its body (``/input/n``).
    """
    try:
        yield
    except HoldpointError as exc:
        if exc.code == "invalid_input" and isinstance(exc.extra.get("errors"), list):
            exc.extra["errors"] = [
                {**error, "pointer": prefix + (error["pointer"] if error["pointer"] != "/" else "")}
                for error in exc.extra["errors"]
            ]
        raise


def problems(*codes: str) -> dict[Any, OpenApiResponse]:
    """Schema responses for ``codes``, grouped by status, each ``application/problem+json``."""
    by_status: dict[int, list[str]] = defaultdict(list)
    for code in dict.fromkeys(codes):
        by_status[ERROR_STATUS[code]].append(code)
    return {
        (status, CONTENT_TYPE): OpenApiResponse(
            response=ProblemSerializer,
            description="Problem details; `code` is one of: "
            + ", ".join(f"`{c}`" for c in sorted(found)),
        )
        for status, found in sorted(by_status.items())
    }


def idempotency_key_parameter(*, required: bool) -> OpenApiParameter:
    return OpenApiParameter(
        name="Idempotency-Key",
        type=OpenApiTypes.STR,
        location=OpenApiParameter.HEADER,
        required=required,
        description=(
            "1-255 printable ASCII characters, bare or as a quoted string. The same key with "
            "the same request replays the first answer (header `Idempotent-Replayed: true`); "
            "with a different request it is a 422; while the first is running, a 409 with "
            "`Retry-After`. Keys are kept per principal for "
            "HOLDPOINT_IDEMPOTENCY_RETENTION_SECONDS (24 h)."
        ),
    )


IDEMPOTENCY_CODES = (
    "idempotency_key_missing",
    "idempotency_key_malformed",
    "idempotency_key_reused",
    "idempotency_in_progress",
)


def command_schema(
    request: type[serializers.Serializer],
    ok: dict[int, Any],
    *codes: str,
    tags: list[str],
    operation_id: str | None = None,
    description: str | None = None,
    key_required: bool = True,
    auth_codes: tuple[str, ...] = AUTH_CODES,
) -> Callable[[Any], Any]:
    """The OpenAPI description of a POST that changes state (``IdempotentMixin.command``):
    its body, its Idempotency-Key header (required or not), its answers ``ok`` and every
    refusal: authentication ``auth_codes``, the body's, the key's, and ``codes``."""
    key_codes = IDEMPOTENCY_CODES if key_required else IDEMPOTENCY_CODES[1:]
    return extend_schema(
        tags=tags,
        operation_id=operation_id,
        description=description,
        request=request,
        parameters=[idempotency_key_parameter(required=key_required)],
        responses={**ok, **problems(*auth_codes, *BODY_CODES, *key_codes, *codes)},
    )
