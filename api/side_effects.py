"""The ledger's HTTP endpoints (docs/api.md): thin views over the services.

Control API (session or token auth): reads need ``runs.view_run`` (an outsider gets
404 for a run or a side effect, 403 for a collection); reconcile and compensate need
``runs.retry_run``, the permission that decides whether a run goes on, and an
``Idempotency-Key`` like the other control operations.

Worker API (worker token, ``Authorization: Bearer hpw_…``): ``begin`` and ``outcome``
call the same services as the in-process worker, so both obey the same fence and
the same decision table; like every worker write they take an optional
``Idempotency-Key``, so a worker that lost an answer gets the same one again.

Errors are ``application/problem+json`` (``api.problems``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.base import (
    AUTH_CODES,
    command_schema,
    pointers_under,
    problems,
    require_perm,
)
from api.idempotency import IdempotentMixin
from api.reads import Cursor, QueryValidated
from api.serializers import UtcDateTimeField
from api.worker import FENCE_CODES, WORKER_AUTH_CODES, WorkerApiView, lease_of, token_id
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
from runs.models import WorkerToken
from runs.selectors import RETRY, VIEW, run_get_for_user
from runs.tokens import serving_for

TAGS = ["side effects"]


# --- Representations --------------------------------------------------------------------------


class ApprovalSerializer(serializers.Serializer):
    source = serializers.ChoiceField(choices=["start", "request"])  # type: ignore[assignment]
    request_id = serializers.CharField(allow_null=True)
    by = serializers.CharField(allow_null=True)
    comment = serializers.CharField(allow_blank=True)
    at = serializers.CharField(allow_null=True)
    action_hash = serializers.CharField(
        allow_null=True,
        default=None,
        help_text="sha256 of the tool, target and request the approval covers.",
    )
    # Issue 18: an approval that edited the plan covers the edit; both are kept.
    original = serializers.JSONField(
        required=False, help_text="The planned request, when an approver edited it."
    )
    edited = serializers.JSONField(
        required=False, help_text="The request as the approvers edited and approved it."
    )
    edited_by = serializers.CharField(
        required=False, help_text="Who edited the request before it was approved."
    )
    approvers = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Everyone whose approval counted, when the policy needed more than one.",
    )


class ResolutionSerializer(serializers.Serializer):
    outcome = serializers.ChoiceField(choices=Resolution.choices)
    by = serializers.CharField()
    note = serializers.CharField()
    at = UtcDateTimeField()


class CompensationSerializer(serializers.Serializer):
    idempotency_key = serializers.CharField()
    external_reference = serializers.CharField(allow_blank=True)
    result = serializers.JSONField(allow_null=True)
    error = serializers.JSONField(allow_null=True)
    by = serializers.CharField(allow_null=True)
    reason = serializers.CharField(allow_blank=True, help_text="Why a person undid the effect.")
    started_at = UtcDateTimeField(allow_null=True)
    ended_at = UtcDateTimeField(allow_null=True)
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
    time = UtcDateTimeField(help_text="When the outcome was known, else when it began.")
    created_at = UtcDateTimeField()
    outcome_at = UtcDateTimeField(allow_null=True)
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


class NotAppliedSerializer(serializers.Serializer):
    request_id = serializers.CharField(help_text="The approval people gave.")
    action = serializers.CharField()
    target = serializers.CharField()
    approved_by = serializers.ListField(child=serializers.CharField())
    approved_at = UtcDateTimeField(allow_null=True)
    edited = serializers.JSONField(allow_null=True, help_text="Their edit, if any.")
    reason = serializers.CharField(help_text="Why it was not applied.")
    asked_again = serializers.CharField(
        allow_null=True, help_text="The request that asked again instead; null: the run failed."
    )
    refused = serializers.BooleanField(help_text="The agent refused the approved edit.")


class ReportSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    total = serializers.IntegerField()
    not_applied = NotAppliedSerializer(
        many=True, help_text="Approvals people gave that did not happen, and why (issue 24)."
    )
    needs_reconciliation = serializers.IntegerField()
    groups = ReportGroupSerializer(many=True)


def effect_data(effect: SideEffect, user: Any) -> dict[str, Any]:
    return dict(SideEffectSerializer(side_effect_rows([effect], user=user)[0]).data)


# --- Control API: reads -----------------------------------------------------------------------


@extend_schema(
    tags=TAGS,
    responses={200: SideEffectSerializer(many=True), **problems(*AUTH_CODES, "not_found")},
)
class RunSideEffectListApi(APIView):
    """Every side effect of the run, in the order they began."""

    def get(self, request: Request, run_id: str) -> Response:
        run = run_get_for_user(user=request.user, run_id=run_id)
        rows = side_effect_rows(list(side_effects_for_run(run.pk)), user=request.user)
        return Response(SideEffectSerializer(rows, many=True).data)


@extend_schema(tags=TAGS, responses={200: ReportSerializer, **problems(*AUTH_CODES, "not_found")})
class RunReportApi(APIView):
    """What the run did to the world: unknown, cannot be undone, happened, compensated,
    did not happen — in that order, with counts, references and who approved."""

    def get(self, request: Request, run_id: str) -> Response:
        run = run_get_for_user(user=request.user, run_id=run_id)
        return Response(ReportSerializer(report_for_run(run.pk, user=request.user)).data)


class SideEffectCursor(Cursor):
    ordering = ("-created_at", "-operation_id")

    def get_ordering(self, request: Request, queryset: Any, view: Any) -> tuple[str, ...]:
        # The reconciliation queue: what has waited longest first.
        if request.query_params.get("status") == "needs_reconciliation":
            return ("created_at", "operation_id")
        return self.ordering


class SideEffectListApi(QueryValidated, ListAPIView):
    """Side effects across runs, newest first. ``status=needs_reconciliation`` is the
    reconciliation queue (unknown, and pending with no live worker), oldest first."""

    serializer_class = SideEffectSerializer
    pagination_class = SideEffectCursor

    class QuerySerializer(serializers.Serializer):
        status = serializers.ChoiceField(
            choices=[*SideEffectStatus.values, "needs_reconciliation"], required=False
        )
        cursor = serializers.CharField(required=False)
        page_size = serializers.IntegerField(min_value=1, max_value=200, required=False)

        class Meta:
            ref_name = "SideEffectListQuery"

    @extend_schema(
        tags=TAGS,
        parameters=[QuerySerializer],
        responses={
            200: SideEffectSerializer(many=True),
            **problems(*AUTH_CODES, "invalid_input"),
        },
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[SideEffect]:
        require_perm(self.request.user, VIEW)
        query = self.query(self.request)
        return side_effects_for_user(user=self.request.user, status=query.get("status"))

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        page = self.paginate_queryset(self.get_queryset()) or []
        rows = side_effect_rows(list(page), user=self.request.user)
        return self.get_paginated_response(SideEffectSerializer(rows, many=True).data)


@extend_schema(
    tags=TAGS, responses={200: SideEffectSerializer, **problems(*AUTH_CODES, "not_found")}
)
class SideEffectDetailApi(APIView):
    def get(self, request: Request, operation_id: str) -> Response:
        effect = side_effect_get_for_user(user=request.user, operation_id=operation_id)
        return Response(effect_data(effect, request.user))


# --- Control API: reconcile and compensate ----------------------------------------------------


class SideEffectReconcileApi(IdempotentMixin, APIView):
    """Settle an unknown (or stale pending) side effect: it happened, or it did not.

    Until every unsettled effect of a run is settled, the run cannot be retried."""

    class InputSerializer(serializers.Serializer):
        outcome = serializers.ChoiceField(choices=Resolution.choices)
        external_reference = serializers.CharField(
            max_length=500, required=False, allow_blank=True, allow_null=True
        )
        note = serializers.CharField(max_length=2000, help_text="What was checked, and how.")

        class Meta:
            ref_name = "SideEffectReconcileInput"

    @command_schema(
        InputSerializer,
        {200: SideEffectSerializer},
        "not_found",
        "invalid_state",
        tags=TAGS,
        operation_id="side_effects_reconcile",
    )
    def post(self, request: Request, operation_id: str) -> HttpResponse:
        effect = side_effect_get_for_user(user=request.user, operation_id=operation_id, perm=RETRY)
        return self.command(
            request,
            lambda data: effect_data(
                services.side_effect_reconcile(
                    operation_id=effect.operation_id,
                    outcome=data["outcome"],
                    external_reference=data.get("external_reference") or None,
                    note=data["note"],
                    user=request.user,
                ),
                request.user,
            ),
        )


class SideEffectCompensateApi(IdempotentMixin, APIView):
    """Undo a confirmed, reversible or compensable side effect with its tool's
    compensating action, under the effect's own compensation key (so trying again
    after a failure is harmless). An irreversible effect is refused. A reason is
    required. When the target changed after the effect (another version on top),
    it is refused with ``409 target_changed`` unless ``force`` is true."""

    class InputSerializer(serializers.Serializer):
        reason = serializers.CharField(max_length=2000, help_text="Why the effect is undone.")
        force = serializers.BooleanField(
            required=False,
            default=False,
            help_text="Restore anyway although the target changed after the effect.",
        )

        class Meta:
            ref_name = "SideEffectCompensateInput"

    @command_schema(
        InputSerializer,
        {200: SideEffectSerializer},
        "not_found",
        "invalid_state",
        "target_changed",
        tags=TAGS,
        operation_id="side_effects_compensate",
    )
    def post(self, request: Request, operation_id: str) -> HttpResponse:
        effect = side_effect_get_for_user(user=request.user, operation_id=operation_id, perm=RETRY)
        return self.command(
            request,
            lambda data: effect_data(
                services.side_effect_compensate(
                    operation_id=effect.operation_id,
                    user=request.user,
                    reason=data["reason"],
                    force=data["force"],
                ),
                request.user,
            ),
        )


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

    ``act``: do it now, passing ``idempotency_key`` to the external system;
    ``look_up``: ask the external system by that key first, act only if it has no
    record; ``reuse``: it was done, here are its result and reference. 409
    ``side_effect_unknown``: fail the attempt with that class; 409
    ``approval_required``: raise an approval hold point for this step first.
    """

    class InputSerializer(serializers.Serializer):
        lease_epoch = serializers.IntegerField(min_value=0)
        cancel_epoch = serializers.IntegerField(min_value=0)
        step_id = serializers.CharField(max_length=100)
        tool = serializers.CharField(max_length=100)
        target = serializers.CharField(max_length=500)
        request = serializers.JSONField(help_text="What the tool is asked to do (an object).")
        reversibility = serializers.ChoiceField(
            choices=Reversibility.choices,
            required=False,
            allow_null=True,
            help_text="Default: the tool's own.",
        )
        compensating_action = serializers.JSONField(required=False, allow_null=True)
        idempotency_key = serializers.CharField(
            max_length=240,
            required=False,
            allow_null=True,
            trim_whitespace=False,
            help_text="Default: derived from run, step and tool (recommended).",
        )

        class Meta:
            ref_name = "WorkerSideEffectBeginInput"

    @command_schema(
        InputSerializer,
        {200: BeginSerializer},
        *FENCE_CODES,
        "side_effect_unknown",
        "approval_required",
        "invalid_state",
        "destination_not_allowed",
        tags=["worker"],
        operation_id="worker_side_effects_begin",
        key_required=False,
        auth_codes=WORKER_AUTH_CODES,
    )
    def post(self, request: Request, attempt_id: str) -> HttpResponse:
        def begin(data: dict[str, Any]) -> Any:
            with pointers_under("/request"):
                begun = services.side_effect_begin(
                    **lease_of(request, attempt_id, data),
                    cancel_epoch=data["cancel_epoch"],
                    step_id=data["step_id"],
                    tool=data["tool"],
                    target=data["target"],
                    request=data["request"],
                    reversibility=data.get("reversibility"),
                    compensating_action=data.get("compensating_action"),
                    idempotency_key=data.get("idempotency_key"),
                )
            return BeginSerializer(
                {
                    "decision": begun.decision,
                    "operation_id": begun.operation_id,
                    "idempotency_key": begun.idempotency_key,
                    "result": begun.result,
                    "external_reference": begun.external_reference,
                    "reversibility": begun.reversibility,
                }
            ).data

        return self.command(request, begin)


class WorkerSideEffectOutcomeApi(WorkerApiView):
    """After acting: record what happened. Never fenced: an outcome from a worker that
    lost its lease, or whose run was cancelled or finished, is recorded too, flagged
    ``late`` (send the epochs of your lease so that the ledger can tell)."""

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

    @command_schema(
        InputSerializer,
        {200: SideEffectSerializer},
        "not_found",
        "agent_not_yours",
        tags=["worker"],
        operation_id="worker_side_effects_outcome",
        key_required=False,
        auth_codes=WORKER_AUTH_CODES,
    )
    def post(self, request: Request, operation_id: str) -> HttpResponse:
        def record(data: dict[str, Any]) -> Any:
            # A fact from any worker that may serve the agent, late or not; never from a
            # token that may not (another token's agent, outside its scope).
            agent = (
                SideEffect.objects.filter(pk=operation_id)
                .values_list("run__agent", flat=True)
                .first()
            )
            assert isinstance(request.auth, WorkerToken)
            why = serving_for(request.auth).why_not(agent) if agent is not None else None
            if why:
                raise HoldpointError("agent_not_yours", why, operation_id=operation_id)
            effect = services.side_effect_record_outcome(
                operation_id=operation_id,
                status=data["status"],
                external_reference=data.get("external_reference") or None,
                result=data.get("result"),
                error=data.get("error"),
                lease_epoch=data.get("lease_epoch"),
                cancel_epoch=data.get("cancel_epoch"),
                worker_token_id=token_id(request),
            )
            # The worker reported this outcome itself: it sees it whole.
            return effect_data(effect, None)

        return self.command(request, record)
