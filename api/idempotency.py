"""``IdempotentMixin``: Idempotency-Key handling for DRF POST endpoints.

Every POST that changes state is written the same way: look the object up and check
the permission, then ``command`` (the key, the body, the service once per key)::

    class SideEffectReconcileApi(IdempotentMixin, APIView):
        idempotency_required = True  # False: the header is optional

        class InputSerializer(serializers.Serializer): ...

        @command_schema(InputSerializer, {200: SideEffectSerializer}, "not_found",
                        tags=["side-effects"])
        def post(self, request, operation_id):
            effect = side_effect_get_for_user(user=request.user, operation_id=operation_id)
            return self.command(
                request, lambda data: effect_data(side_effect_reconcile(...), request.user)
            )

Rules the mixin keeps (docs/api.md, Idempotency-Key):

- Authenticate, check permission and look the object up *before* ``idempotent``:
  another principal's key must never return someone else's response, and an
  outsider gets the same 404 with or without a key.
- ``execute`` calls the service and returns a DRF ``Response``. A ``HoldpointError``
  it raises is the answer to that request: it is rendered as problem+json, stored
  and replayed like a success. Other exceptions and 5xx answers are not stored.
- Keys are scoped to ``request.user`` (``user:<pk>``) or to the worker
  (``worker:<name>``); the fingerprint is method + path + canonical JSON body, so
  the same key on another run or another operation is a 422.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpResponse
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from api.authentication import WorkerPrincipal
from api.base import validated
from api.problems import CONTENT_TYPE, error_body, render_problem
from runs.errors import HoldpointError
from runs.idempotency import (
    HEADER,
    REPLAYED_HEADER,
    StoredResponse,
    idempotent_call,
    parse_idempotency_key,
    principal_for_user,
)

_UNSET = object()


class IdempotentMixin:
    """Adds ``idempotency_key(request)`` and ``idempotent(request, execute)`` to an APIView."""

    idempotency_required: bool = True
    # True when the view's ``execute`` is one service call whose only effects are rows
    # (runs.idempotency, "In one transaction"): the record is then written in the
    # service's transaction. Never for a call that reaches outside the database.
    idempotency_in_transaction: bool = False
    InputSerializer: type[serializers.Serializer]

    def command(
        self,
        request: Request,
        perform: Callable[[dict[str, Any]], Any],
        *,
        status: int = 200,
        refuse: Callable[[dict[str, Any]], None] | None = None,
    ) -> HttpResponse:
        """A POST that changes state, after its object and permission checks: the
        Idempotency-Key (its 400s come before the body's), the body (``InputSerializer``:
        422 ``invalid_input``), ``refuse(data)`` (a refusal no answer is stored for), then
        ``perform(data)`` once per key. What ``perform`` returns is the answer's body with
        ``status``; a ``Response`` it returns is the answer as it is."""
        self.idempotency_key(request)
        data = validated(self.InputSerializer, request.data)
        if refuse is not None:
            refuse(data)

        def execute() -> Response:
            result = perform(data)
            return result if isinstance(result, Response) else Response(result, status=status)

        return self.idempotent(request, execute)

    def idempotency_principal(self, request: Request) -> str:
        user = request.user
        if isinstance(user, WorkerPrincipal):
            return user.principal
        return principal_for_user(user)

    def idempotency_key(self, request: Request) -> str | None:
        """The request's key (parsed once), None when absent and optional; raises 400s."""
        cached = getattr(request, "_holdpoint_idempotency_key", _UNSET)
        if cached is not _UNSET:
            return cached  # type: ignore[return-value]
        raw = request.META.get("HTTP_" + HEADER.upper().replace("-", "_"))
        values = [] if raw is None else [raw]
        key = (
            None if not values and not self.idempotency_required else parse_idempotency_key(values)
        )
        request._holdpoint_idempotency_key = key  # type: ignore[attr-defined]
        return key

    def idempotent(self, request: Request, execute: Callable[[], Response]) -> HttpResponse:
        """Run ``execute`` once per key and answer its response, or the stored one again."""
        key = self.idempotency_key(request)
        if key is None:
            return execute()

        def run() -> StoredResponse:
            try:
                response = execute()
            except HoldpointError as exc:
                return StoredResponse(
                    status=exc.status,
                    body=render_problem(error_body(exc, request.path)),
                    content_type=CONTENT_TYPE,
                )
            return StoredResponse(
                status=response.status_code,
                body=JSONRenderer().render(response.data),
                content_type="application/json",
            )

        stored, replayed = idempotent_call(
            principal=self.idempotency_principal(request),
            key=key,
            method=request.method or "POST",
            path=request.path,
            body=_plain(request.data),
            execute=run,
            in_transaction=self.idempotency_in_transaction,
        )
        response = HttpResponse(stored.body, status=stored.status, content_type=stored.content_type)
        if replayed:
            response[REPLAYED_HEADER] = "true"
        return response


def _plain(data: Any) -> Any:
    """request.data as plain JSON values (a QueryDict would not canonicalise)."""
    if hasattr(data, "dict") and not isinstance(data, dict):
        return data.dict()
    return data
