"""The ledger's HTTP endpoints (DESIGN.md section 7): thin views over the services.

Control API (session or token auth): reads need ``runs.view_run`` (an outsider gets
404 for a run or a side effect, 403 for a collection); reconcile and compensate need
``runs.retry_run``, the permission that decides whether a run goes on.

Worker API: ``begin`` and ``outcome`` call the same services as the in-process
worker, so both obey the same fence and the same decision table.

Until the shared API machinery of issue 3 is on main, three things are interim here
and named so in ``LedgerApiView`` and ``WorkerApiView``: errors are rendered by a
small local problem+json handler, POSTs take no ``Idempotency-Key``, and the worker
endpoints accept a staff user's session or token instead of a worker token.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import IsAdminUser, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger import services
from ledger.models import Resolution, Reversibility, SideEffect, SideEffectStatus
from ledger.selectors import (
    report_for_run,
    side_effect_get_for_user,
    side_effect_rows,
    side_effects_for_run,
    side_effects_for_user,
)
from runs.errors import HoldpointError
from runs.selectors import RETRY, VIEW, run_get_for_user

PROBLEM_CONTENT_TYPE = "application/problem+json"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def problem(exc: HoldpointError, request: Request) -> Response:
    body = {
        "type": f"urn:holdpoint:problem:{exc.code}",
        "title": exc.code.replace("_", " ").capitalize(),
        "status": exc.status,
        "detail": exc.detail,
        "code": exc.code,
        "instance": request.path,
        **_jsonable(exc.extra),
    }
    return Response(body, status=exc.status, content_type=PROBLEM_CONTENT_TYPE)


def validated(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    """Validate ``data``; a failure is a 422 ``invalid_input`` with a pointer per field."""
    serializer = serializer_class(data=data)
    try:
        serializer.is_valid(raise_exception=True)
    except ValidationError as exc:
        detail = exc.detail if isinstance(exc.detail, dict) else {"": exc.detail}
        errors = [
            {"pointer": f"/{field}" if field != "non_field_errors" else "/", "message": str(msg)}
            for field, messages in detail.items()
            for msg in (messages if isinstance(messages, list) else [messages])
        ]
        raise HoldpointError(
            "invalid_input",
            "The request body is not valid: "
            + "; ".join(f"{e['pointer']}: {e['message']}" for e in errors),
            errors=errors,
        ) from None
    return dict(serializer.validated_data)


class LedgerApiView(APIView):
    """Base of the control endpoints.

    Interim (issue 3): ``HoldpointError`` is rendered here; once ``runs.problems`` is
    DRF's exception handler this override goes.
    """

    permission_classes = [IsAuthenticated]

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, HoldpointError):
            return problem(exc, self.request)
        return super().handle_exception(exc)


class WorkerApiView(LedgerApiView):
    """Base of the worker endpoints.

    Interim (issue 3): a staff user's session or DRF token stands in for a worker
    token (``WorkerTokenAuthentication`` / ``IsWorker``); the fence is checked by the
    service either way.
    """

    permission_classes = [IsAuthenticated, IsAdminUser]


# --- Representations --------------------------------------------------------------------------


class ApprovalSerializer(serializers.Serializer):
    source = serializers.ChoiceField(choices=["start", "request"])  # type: ignore[assignment]
    request_id = serializers.CharField(allow_null=True)
    by = serializers.CharField(allow_null=True)
    comment = serializers.CharField(allow_blank=True)
    at = serializers.CharField(allow_null=True)


class ResolutionSerializer(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=Resolution.choices)
    by = serializers.CharField()
    note = serializers.CharField()
    at = serializers.DateTimeField()


class CompensationSerializer(serializers.Serializer):
    idempotency_key = serializers.CharField()
    external_reference = serializers.CharField(allow_blank=True)
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    by = serializers.CharField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    in_progress = serializers.BooleanField()


class SideEffectSerializer(serializers.Serializer):
    operation_id = serializers.CharField()
    run_id = serializers.CharField()
    attempt_id = serializers.CharField()
    step_id = serializers.CharField()
    tool = serializers.CharField()
    target = serializers.CharField()
    status = serializers.ChoiceField(choices=SideEffectStatus.choices)
    reversibility = serializers.ChoiceField(choices=Reversibility.choices)
    idempotency_key = serializers.CharField()
    generation = serializers.IntegerField()
    external_reference = serializers.CharField(allow_blank=True)
    request = serializers.JSONField()
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    late = serializers.BooleanField(help_text="Reported by a worker that no longer held the run.")
    compensating_action = serializers.JSONField(allow_null=True)
    time = serializers.DateTimeField(help_text="When the outcome was known, else when it began.")
    created_at = serializers.DateTimeField()
    outcome_at = serializers.DateTimeField(allow_null=True)
    outcome_by = serializers.CharField(allow_null=True)
    approved_by = serializers.CharField(allow_null=True)
    approval_comment = serializers.CharField(allow_null=True, allow_blank=True)
    approval = ApprovalSerializer(allow_null=True)
    resolution = ResolutionSerializer(allow_null=True)
    compensation = CompensationSerializer(allow_null=True)
    needs_reconciliation = serializers.BooleanField()
    can_compensate = serializers.BooleanField()


class ReportGroupSerializer(serializers.Serializer):
    key = serializers.ChoiceField(
        choices=["unknown", "cannot_be_undone", "happened", "compensated", "did_not_happen"]
    )
    title = serializers.CharField()
    count = serializers.IntegerField()
    rows = SideEffectSerializer(many=True)


class ReportSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    total = serializers.IntegerField()
    needs_reconciliation = serializers.IntegerField()
    groups = ReportGroupSerializer(many=True)


def effect_data(effect: SideEffect) -> dict[str, Any]:
    return dict(SideEffectSerializer(side_effect_rows([effect])[0]).data)


# --- Control API: reads -----------------------------------------------------------------------


@extend_schema(tags=["side effects"], responses={200: SideEffectSerializer(many=True)})
class RunSideEffectListApi(LedgerApiView):
    """Every side effect of the run, in the order they began."""

    def get(self, request: Request, run_id: str) -> Response:
        run = run_get_for_user(user=request.user, run_id=run_id)
        rows = side_effect_rows(list(side_effects_for_run(run.pk)))
        return Response(SideEffectSerializer(rows, many=True).data)


@extend_schema(tags=["side effects"], responses={200: ReportSerializer})
class RunReportApi(LedgerApiView):
    """What the run did to the world: unknown, cannot be undone, happened, compensated,
    did not happen — in that order, with counts, references and approvers."""

    def get(self, request: Request, run_id: str) -> Response:
        run = run_get_for_user(user=request.user, run_id=run_id)
        return Response(ReportSerializer(report_for_run(run.pk)).data)


class SideEffectCursor(CursorPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200
    ordering = ("-created_at", "-operation_id")

    def get_ordering(self, request: Request, queryset: Any, view: Any) -> tuple[str, ...]:
        # The reconciliation queue: what has waited longest first.
        if request.query_params.get("status") == "needs_reconciliation":
            return ("created_at", "operation_id")
        return self.ordering


class SideEffectListApi(LedgerApiView):
    """Side effects across runs, newest first; ``status=needs_reconciliation`` gives the
    reconciliation queue (unknown, and pending with no live worker), oldest first."""

    class QuerySerializer(serializers.Serializer):
        status = serializers.ChoiceField(
            choices=[*SideEffectStatus.values, "needs_reconciliation"], required=False
        )
        cursor = serializers.CharField(required=False)
        page_size = serializers.IntegerField(min_value=1, max_value=200, required=False)

    @extend_schema(
        tags=["side effects"],
        parameters=[QuerySerializer],
        responses={200: SideEffectSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        if not request.user.has_perm(VIEW):
            raise HoldpointError("permission_denied", "You do not have the view_run permission.")
        query = validated(self.QuerySerializer, request.query_params)
        effects = side_effects_for_user(user=request.user, status=query.get("status"))
        paginator = SideEffectCursor()
        page = paginator.paginate_queryset(effects, request, view=self) or []
        rows = side_effect_rows(list(page))
        return paginator.get_paginated_response(SideEffectSerializer(rows, many=True).data)


@extend_schema(tags=["side effects"], responses={200: SideEffectSerializer})
class SideEffectDetailApi(LedgerApiView):
    def get(self, request: Request, operation_id: str) -> Response:
        effect = side_effect_get_for_user(user=request.user, operation_id=operation_id)
        return Response(effect_data(effect))


# --- Control API: reconcile and compensate ----------------------------------------------------


class SideEffectReconcileApi(LedgerApiView):
    """Settle an unknown (or stale pending) side effect: it happened, or it did not."""

    class InputSerializer(serializers.Serializer):
        outcome = serializers.ChoiceField(choices=Resolution.choices)
        external_reference = serializers.CharField(
            max_length=500, required=False, allow_blank=True, allow_null=True
        )
        note = serializers.CharField(max_length=2000, help_text="Why: what was checked.")

        class Meta:
            ref_name = "SideEffectReconcileInput"

    @extend_schema(
        tags=["side effects"],
        request=InputSerializer,
        responses={
            200: SideEffectSerializer,
            409: OpenApiResponse(description="invalid_state: already settled, or in progress"),
        },
    )
    def post(self, request: Request, operation_id: str) -> Response:
        effect = side_effect_get_for_user(user=request.user, operation_id=operation_id, perm=RETRY)
        data = validated(self.InputSerializer, request.data)
        effect = services.side_effect_reconcile(
            operation_id=effect.operation_id,
            outcome=data["outcome"],
            external_reference=data.get("external_reference") or None,
            note=data["note"],
            user=request.user,
        )
        return Response(effect_data(effect))


class SideEffectCompensateApi(LedgerApiView):
    """Undo a confirmed, reversible or compensable side effect with its tool's
    compensating action (its own idempotency key: trying again is harmless)."""

    @extend_schema(
        tags=["side effects"],
        request=None,
        responses={
            200: SideEffectSerializer,
            409: OpenApiResponse(description="invalid_state: irreversible, not confirmed, busy"),
        },
    )
    def post(self, request: Request, operation_id: str) -> Response:
        effect = side_effect_get_for_user(user=request.user, operation_id=operation_id, perm=RETRY)
        effect = services.side_effect_compensate(
            operation_id=effect.operation_id, user=request.user
        )
        return Response(effect_data(effect))


# --- Worker API -------------------------------------------------------------------------------


class BeginSerializer(serializers.Serializer):
    decision = serializers.ChoiceField(choices=["act", "look_up", "reuse"])
    operation_id = serializers.CharField()
    idempotency_key = serializers.CharField()
    result = serializers.JSONField(allow_null=True)
    external_reference = serializers.CharField(allow_blank=True)
    reversibility = serializers.ChoiceField(choices=Reversibility.choices)


class WorkerSideEffectBeginApi(WorkerApiView):
    """Before acting: write the intent (fenced) or learn what the ledger already knows.

    ``act``: do it now, passing ``idempotency_key``; ``look_up``: ask the external
    system by key first; ``reuse``: it was done, here is its result. 409
    ``side_effect_unknown``: fail the attempt with that class; 409
    ``approval_required``: ask for an approval of this step first.
    """

    class InputSerializer(serializers.Serializer):
        lease_epoch = serializers.IntegerField(min_value=0)
        cancel_epoch = serializers.IntegerField(min_value=0)
        step_id = serializers.CharField(max_length=100)
        tool = serializers.CharField(max_length=100)
        target = serializers.CharField(max_length=500)
        request = serializers.JSONField()
        reversibility = serializers.ChoiceField(
            choices=Reversibility.choices, required=False, allow_null=True
        )
        compensating_action = serializers.JSONField(required=False, allow_null=True)
        idempotency_key = serializers.CharField(
            max_length=240, required=False, allow_null=True, trim_whitespace=False
        )

        class Meta:
            ref_name = "WorkerSideEffectBeginInput"

    @extend_schema(
        tags=["worker"],
        request=InputSerializer,
        responses={
            200: BeginSerializer,
            409: OpenApiResponse(
                description="stale_after_cancel, stale_worker, side_effect_unknown, "
                "approval_required"
            ),
        },
    )
    def post(self, request: Request, attempt_id: str) -> Response:
        data = validated(self.InputSerializer, request.data)
        begin = services.side_effect_begin(
            attempt_id=attempt_id,
            lease_epoch=data["lease_epoch"],
            cancel_epoch=data["cancel_epoch"],
            step_id=data["step_id"],
            tool=data["tool"],
            target=data["target"],
            request=data["request"],
            reversibility=data.get("reversibility"),
            compensating_action=data.get("compensating_action"),
            idempotency_key=data.get("idempotency_key"),
        )
        return Response(
            BeginSerializer(
                {
                    "decision": begin.decision,
                    "operation_id": begin.operation_id,
                    "idempotency_key": begin.idempotency_key,
                    "result": begin.result,
                    "external_reference": begin.external_reference,
                    "reversibility": begin.reversibility,
                }
            ).data
        )


class WorkerSideEffectOutcomeApi(WorkerApiView):
    """After acting: record what happened. Never fenced: an outcome from a worker that
    lost its lease or whose run was cancelled is recorded too, flagged ``late``."""

    class InputSerializer(serializers.Serializer):
        status = serializers.ChoiceField(choices=["confirmed", "failed", "unknown"])
        external_reference = serializers.CharField(
            max_length=500, required=False, allow_blank=True, allow_null=True
        )
        result = serializers.JSONField(required=False, allow_null=True)
        error = serializers.JSONField(required=False, allow_null=True)
        lease_epoch = serializers.IntegerField(min_value=0, required=False, allow_null=True)
        cancel_epoch = serializers.IntegerField(min_value=0, required=False, allow_null=True)

        class Meta:
            ref_name = "WorkerSideEffectOutcomeInput"

    @extend_schema(tags=["worker"], request=InputSerializer, responses={200: SideEffectSerializer})
    def post(self, request: Request, operation_id: str) -> Response:
        data = validated(self.InputSerializer, request.data)
        effect = services.side_effect_record_outcome(
            operation_id=operation_id,
            status=data["status"],
            external_reference=data.get("external_reference") or None,
            result=data.get("result"),
            error=data.get("error"),
            lease_epoch=data.get("lease_epoch"),
            cancel_epoch=data.get("cancel_epoch"),
        )
        return Response(effect_data(effect))
