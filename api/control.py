"""The control operations over HTTP: start a run, resume, cancel, retry.

Each view checks, in this order: authentication (DRF), the run and the permission
(``runs.selectors``: 404 for outsiders, 403 for people who may look but not act),
the Idempotency-Key header, the body; then it calls the one service function and
answers with the run as the command left it (202; 201 for a new run).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.views import APIView

from api.base import api_identity, command_schema, pointers_under, require_perm
from api.idempotency import IdempotentMixin
from api.reads import RunListApi
from api.serializers import RunSerializer
from runs import services
from runs.audit import API
from runs.errors import HoldpointError
from runs.selectors import (
    ANSWER,
    APPROVE,
    CANCEL,
    RETRY,
    START,
    permission_for_request_kind,
    request_kind,
    run_get_for_user,
)

STATE_CODES = ("invalid_state", "not_found")


class RunStartApi(IdempotentMixin, APIView):
    """Start a run of a known agent (a Python agent or a declared HTTP-worker agent)."""

    idempotency_required = False
    idempotency_in_transaction = True

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "RunStartInput"

        agent = serializers.CharField(max_length=100)
        input = serializers.JSONField(required=False, default=dict)
        approvals = serializers.ListField(
            child=serializers.CharField(max_length=100),
            required=False,
            max_length=100,
            help_text="Step ids approved at start. This is an approval by the caller: it "
            "needs the approve permission (403 `preapproval_not_permitted` without it).",
        )
        pause_before = serializers.ListField(
            child=serializers.CharField(max_length=100),
            required=False,
            max_length=100,
            help_text="Breakpoints: the run pauses before each of these steps, every time.",
        )

    @command_schema(
        InputSerializer,
        {201: RunSerializer},
        "unknown_agent",
        "preapproval_not_permitted",
        tags=["control"],
        operation_id="runs_start",
        description="Start a run of a known agent (a Python agent or a declared HTTP-worker "
        "agent); the input is checked against the agent's input schema.",
        key_required=False,
    )
    def post(self, request: Request) -> HttpResponse:
        require_perm(request.user, START)

        def refuse(data: dict[str, Any]) -> None:
            # Refused before the idempotent call, so that no answer is stored for the key:
            # the service refuses it too (and nothing is created either way).
            if data.get("approvals") and not request.user.has_perm(APPROVE):
                raise HoldpointError(
                    "preapproval_not_permitted",
                    "Approving steps when a run starts is an approval: it needs the approve "
                    "permission.",
                    approvals=data["approvals"],
                )

        def start(data: dict[str, Any]) -> Any:
            with pointers_under("/input"):
                run = services.run_start(
                    agent=data["agent"],
                    input=data["input"],
                    approvals=data.get("approvals"),
                    pause_before=data.get("pause_before"),
                    user=request.user,
                    via=API,
                    identity=api_identity(request),
                )
            return RunSerializer(run).data

        return self.command(request, start, status=201, refuse=refuse)


class RunResumeApi(IdempotentMixin, APIView):
    """Answer the run's pending question or approval; a new attempt continues from it.

    Answering an ``input_required`` request needs ``answer``; an ``auth_required``
    one needs ``approve`` (its value is ``{decision: approve | deny | respond, comment,
    edited?}``, a comment required to deny or respond) and may need more than one person
    (its ``policy``): until then the request stays pending and counts the approvals.
    """

    idempotency_in_transaction = True

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "RunResumeInput"

        request_id = serializers.CharField(max_length=40)
        checkpoint_id = serializers.CharField(
            max_length=40,
            allow_null=True,
            help_text="null only to continue a run paused before its first checkpoint.",
        )
        value = serializers.JSONField(
            allow_null=True,
            required=False,
            default=None,
            help_text="Checked against the schema; absent or null to continue a paused run.",
        )

    @command_schema(
        InputSerializer,
        {202: RunSerializer},
        *STATE_CODES,
        "request_mismatch",
        "stale_checkpoint",
        "request_expired",
        "approval_not_allowed",
        tags=["control"],
        operation_id="runs_resume",
    )
    def post(self, request: Request, run_id: str) -> HttpResponse:
        user = request.user
        run = run_get_for_user(user=user, run_id=run_id)
        if not (user.has_perm(ANSWER) or user.has_perm(APPROVE) or user.has_perm(CANCEL)):
            raise PermissionDenied("You may neither answer questions nor approve actions.")

        def refuse(data: dict[str, Any]) -> None:
            kind = request_kind(run_id=run.pk, request_id=data["request_id"])
            # A request of another run is left to the service, which names the pending one.
            if kind is not None:
                require_perm(user, permission_for_request_kind(kind))

        def resume(data: dict[str, Any]) -> Any:
            with pointers_under("/value"):
                resumed = services.run_resume(
                    run_id=run.pk,
                    request_id=data["request_id"],
                    checkpoint_id=data["checkpoint_id"],
                    value=data["value"],
                    user=user,
                    via=API,
                    identity=api_identity(request),
                )
            return RunSerializer(resumed).data

        return self.command(request, resume, status=202, refuse=refuse)


class RunCancelApi(IdempotentMixin, APIView):
    """Cancel the goal. With a live lease the run is ``cancel_requested`` until the worker
    acknowledges or its lease ends; otherwise it is ``cancelled`` at once."""

    idempotency_in_transaction = True

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "RunCancelInput"

        reason = serializers.CharField(
            max_length=2000, required=False, default="", allow_blank=True
        )

    @command_schema(
        InputSerializer,
        {202: RunSerializer},
        *STATE_CODES,
        tags=["control"],
        operation_id="runs_cancel",
    )
    def post(self, request: Request, run_id: str) -> HttpResponse:
        run = run_get_for_user(user=request.user, run_id=run_id, perm=CANCEL)
        return self.command(
            request,
            lambda data: (
                RunSerializer(
                    services.run_cancel(
                        run_id=run.pk,
                        reason=data["reason"],
                        user=request.user,
                        via=API,
                        identity=api_identity(request),
                    )
                ).data
            ),
            status=202,
        )


class RunRetryApi(IdempotentMixin, APIView):
    """Try a failed or cancelled run again in a new attempt, from ``from_checkpoint`` or
    the latest checkpoint. The old attempts keep their errors and costs."""

    idempotency_in_transaction = True

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "RunRetryInput"

        reason = serializers.CharField(max_length=2000)
        from_checkpoint = serializers.CharField(max_length=40, required=False, allow_null=True)

    @command_schema(
        InputSerializer,
        {202: RunSerializer},
        *STATE_CODES,
        "retry_not_allowed",
        tags=["control"],
        operation_id="runs_retry",
    )
    def post(self, request: Request, run_id: str) -> HttpResponse:
        run = run_get_for_user(user=request.user, run_id=run_id, perm=RETRY)
        return self.command(
            request,
            lambda data: (
                RunSerializer(
                    services.run_retry(
                        run_id=run.pk,
                        reason=data["reason"],
                        from_checkpoint_id=data.get("from_checkpoint"),
                        user=request.user,
                        via=API,
                        identity=api_identity(request),
                    )
                ).data
            ),
            status=202,
        )


class RunCollectionApi(RunStartApi, RunListApi):
    """``/api/runs``: GET lists runs (``RunListApi``), POST starts one (``RunStartApi``)."""
