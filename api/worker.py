"""The worker API: an agent written in any language holds leases over HTTP.

Authenticated by worker tokens only (``Authorization: Bearer hpw_…``). Each endpoint
calls the same service as the in-process Python worker, so both obey the same
fence (docs/api.md, worker protocol): a write whose ``cancel_epoch`` is old gets 409
``stale_after_cancel``, one whose ``lease_epoch`` is old (or whose lease ran out)
409 ``stale_worker``, and a refused write changes nothing. Heartbeat and release
are fenced by ``lease_epoch`` only.

The protocol::

    POST /api/worker/claim                      -> 200 lease | 204 nothing to do
    POST /api/worker/attempts/{id}/heartbeat    every lease_seconds / 3
    POST /api/worker/attempts/{id}/checkpoint   at step boundaries
    POST /api/worker/attempts/{id}/interrupt    at a hold point (then stop)
    POST /api/worker/attempts/{id}/complete | fail | release

The ledger adds two routes here with the same authentication (``WorkerTokenAuthentication``
+ ``IsWorker``): ``POST /api/worker/attempts/{id}/side-effects`` ({…epochs, step_id,
tool, idempotency_key, target, request, reversibility, compensating_action} ->
decision act | look_up | reuse; fenced, as starting an action is an intention) and
``POST /api/worker/side-effects/{operation_id}/outcome`` ({status,
external_reference?, result?, error?}; never fenced: an outcome is a fact).

An attempt is bound to the worker token that claimed it: every write about it (the
fenced ones, heartbeat and release) from another token gets 409 ``not_your_lease``
and changes nothing.

Writes take an optional Idempotency-Key (scoped to the worker token's name): a
worker that lost a response retries with the same key and gets the same answer
instead of a ``stale_worker`` for its own earlier success.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.views import APIView

from api.authentication import AnonymousRateAuthentication, IsWorker, WorkerTokenAuthentication
from api.base import command_schema
from api.idempotency import IdempotentMixin
from api.serializers import CheckpointSerializer, InputRequestSerializer, checkpoint_data, utc
from api.worker_identity import identity_from_headers, record_identity
from runs import services
from runs.models import Checkpoint, Run, WorkerToken
from runs.states import RequestKind, RunStatus

WORKER_AUTH_CODES = (
    "not_authenticated",
    "authentication_failed",
    "permission_denied",
    "throttled",
    "malformed_request",
    "overloaded",
)
FENCE_CODES = ("stale_after_cancel", "stale_worker", "not_your_lease", "not_found")
KEY_CODES = ("idempotency_key_malformed", "idempotency_key_reused", "idempotency_in_progress")


def token_id(request: Request) -> int:
    """The id of the worker token the request came with (``IsWorker`` made sure of one)."""
    assert isinstance(request.auth, WorkerToken)
    return request.auth.pk


def lease_of(request: Request, attempt_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """What every write about an attempt tells its service: the token that holds the
    lease, the attempt and its ``lease_epoch`` (heartbeat and release are fenced by these)."""
    return {
        "worker_token_id": token_id(request),
        "attempt_id": attempt_id,
        "lease_epoch": data["lease_epoch"],
    }


def fenced(request: Request, attempt_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """``lease_of`` and the ``cancel_epoch`` and the cost so far (``FencedInput``): the
    fence of every write that records the agent's work."""
    return {
        **lease_of(request, attempt_id, data),
        "cancel_epoch": data["cancel_epoch"],
        "cost": data.get("cost"),
    }


class WorkerApiView(IdempotentMixin, APIView):
    # Without a worker token a request is counted as anonymous (per address) before IsWorker
    # refuses it.
    authentication_classes = [WorkerTokenAuthentication, AnonymousRateAuthentication]
    permission_classes = [IsWorker]
    idempotency_required = False

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        """After the token, permission and throttle: the worker's identity headers, on
        every call, are its presence (``api/worker_identity.py``)."""
        super().initial(request, *args, **kwargs)
        identity = identity_from_headers(request)
        request.worker_identity = identity  # type: ignore[attr-defined]
        if identity is not None:
            record_identity(identity, request)


# --- Representations --------------------------------------------------------------------------


class ResumeFromSerializer(serializers.Serializer):
    checkpoint_id = serializers.CharField()
    step = serializers.CharField()
    state = serializers.JSONField()
    number = serializers.IntegerField()


class ResumeRequestSerializer(serializers.Serializer):
    request_id = serializers.CharField()
    kind = serializers.ChoiceField(choices=RequestKind.choices)
    step_id = serializers.CharField()
    answer = serializers.JSONField(allow_null=True)
    answered_by = serializers.CharField(allow_null=True)
    action = serializers.JSONField(
        allow_null=True,
        help_text="What an approval showed (tool, target, change); it covers that action only.",
    )


class LeaseSerializer(serializers.Serializer):
    attempt_id = serializers.CharField()
    run_id = serializers.CharField()
    agent = serializers.CharField()
    number = serializers.IntegerField()
    reason = serializers.CharField()
    worker_id = serializers.CharField()
    lease_epoch = serializers.IntegerField()
    cancel_epoch = serializers.IntegerField()
    lease_seconds = serializers.FloatField()
    heartbeat_seconds = serializers.FloatField(help_text="Renew at least this often.")
    lease_expires_at = serializers.CharField()
    input = serializers.JSONField()
    approvals = serializers.ListField(child=serializers.CharField())
    pause_before = serializers.ListField(
        child=serializers.CharField(),
        help_text="Breakpoints: before each of these steps, interrupt with kind 'pause'.",
    )
    resume_from = ResumeFromSerializer(allow_null=True)
    resume_request = ResumeRequestSerializer(allow_null=True)


class HeartbeatSerializer(serializers.Serializer):
    lease_expires_at = serializers.CharField()
    cancel_requested = serializers.BooleanField()
    pause_requested = serializers.BooleanField(
        help_text="Stop at the next step boundary: save the checkpoint, then release 'paused'."
    )


class BoundarySerializer(CheckpointSerializer):
    pause_requested = serializers.BooleanField(
        help_text="Stop here: release with reason 'paused' instead of running the step."
    )

    class Meta(CheckpointSerializer.Meta):
        fields = [*CheckpointSerializer.Meta.fields, "pause_requested"]

    def to_representation(self, instance: Checkpoint) -> dict[str, Any]:
        return {**checkpoint_data(instance), "pause_requested": bool(instance.pause_requested)}


class RunStateSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    status = serializers.CharField()
    failure_class = serializers.CharField()
    cancel_epoch = serializers.IntegerField()
    lease_epoch = serializers.IntegerField()
    pause_requested = serializers.BooleanField()


# The lease's members the protocol answers (LeaseSerializer), named one by one: a field
# the service's Lease gains for the server's own use (run_cost, a Decimal) never leaks
# into the answer by accident (tests/api/test_worker_heartbeats.py).
LEASE_FIELDS = (
    "attempt_id",
    "run_id",
    "agent",
    "number",
    "reason",
    "worker_id",
    "lease_epoch",
    "cancel_epoch",
    "lease_seconds",
    "lease_expires_at",
    "input",
    "approvals",
    "pause_before",
    "resume_from",
    "resume_request",
)


def lease_data(lease: services.Lease) -> dict[str, Any]:
    data = {name: getattr(lease, name) for name in LEASE_FIELDS}
    data["lease_expires_at"] = utc(lease.lease_expires_at)
    data["heartbeat_seconds"] = round(lease.lease_seconds / 3, 3)
    return data


def run_state(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.pk,
        "status": run.status,
        "failure_class": run.failure_class,
        "cancel_epoch": run.cancel_epoch,
        "lease_epoch": run.lease_epoch,
        "pause_requested": run.status == RunStatus.PAUSE_REQUESTED,
    }


# --- Inputs ------------------------------------------------------------------------------------


class LeaseInput(serializers.Serializer):
    lease_epoch = serializers.IntegerField(min_value=0)


class FencedInput(LeaseInput):
    cancel_epoch = serializers.IntegerField(min_value=0)
    cost = serializers.FloatField(
        min_value=0, required=False, allow_null=True, help_text="The attempt's cost so far."
    )


def _write_schema(request: type[serializers.Serializer], ok: Any, *codes: str) -> Any:
    return command_schema(
        request,
        ok,
        *codes,
        tags=["worker"],
        key_required=False,
        auth_codes=WORKER_AUTH_CODES,
    )


# --- Endpoints ---------------------------------------------------------------------------------


class WorkerHeartbeatApi(WorkerApiView):
    """Renew the lease; the answer says whether the run was cancelled (then release)."""

    idempotency_in_transaction = (
        True  # only rows change: the record joins the service's transaction
    )

    class InputSerializer(LeaseInput):
        class Meta:
            ref_name = "WorkerHeartbeatInput"

        cancel_epoch = serializers.IntegerField(
            min_value=0, required=False, help_text="Accepted; heartbeats are not fenced by it."
        )
        lease_seconds = serializers.FloatField(min_value=0.1, max_value=3600, required=False)
        cost = serializers.FloatField(min_value=0, required=False, allow_null=True)

    @_write_schema(
        InputSerializer, {200: HeartbeatSerializer}, "stale_worker", "not_your_lease", "not_found"
    )
    def post(self, request: Request, attempt_id: str) -> HttpResponse:
        def beat(data: dict[str, Any]) -> dict[str, Any]:
            heartbeat = services.attempt_heartbeat(
                **lease_of(request, attempt_id, data),
                lease_seconds=data.get("lease_seconds"),
                cost=data.get("cost"),
            )
            return {
                "lease_expires_at": utc(heartbeat.lease_expires_at),
                "cancel_requested": heartbeat.cancel_requested,
                "pause_requested": heartbeat.pause_requested,
            }

        return self.command(request, beat)


class WorkerReleaseApi(WorkerApiView):
    """Give the lease back: ``cancelled`` acknowledges a cancel (the run becomes
    ``cancelled``), ``shutdown`` queues a new attempt from the latest checkpoint at once,
    ``paused`` stops at a step boundary after ``pause_requested`` (the run becomes
    ``paused``, or waits ``queued`` while its agent's gate is closed)."""

    class InputSerializer(LeaseInput):
        class Meta:
            ref_name = "WorkerReleaseInput"

        reason = serializers.ChoiceField(choices=["cancelled", "shutdown", "paused"])
        cancel_epoch = serializers.IntegerField(min_value=0, required=False)

    @_write_schema(
        InputSerializer,
        {200: RunStateSerializer},
        "stale_worker",
        "not_your_lease",
        "not_found",
        "invalid_state",
    )
    def post(self, request: Request, attempt_id: str) -> HttpResponse:
        return self.command(
            request,
            lambda data: run_state(
                services.attempt_release(
                    **lease_of(request, attempt_id, data), reason=data["reason"]
                )
            ),
        )


class WorkerCheckpointApi(WorkerApiView):
    """Save an immutable snapshot of agent state; ``step`` names the step to run next.

    The answer's ``pause_requested`` says whether to stop at this boundary (release
    ``paused``) instead of running the step."""

    idempotency_in_transaction = (
        True  # only rows change: the record joins the service's transaction
    )

    class InputSerializer(FencedInput):
        class Meta:
            ref_name = "WorkerCheckpointInput"

        step = serializers.CharField(max_length=100)
        state = serializers.JSONField()

    @_write_schema(InputSerializer, {201: BoundarySerializer}, *FENCE_CODES)
    def post(self, request: Request, attempt_id: str) -> HttpResponse:
        return self.command(
            request,
            lambda data: (
                BoundarySerializer(
                    services.checkpoint_save(
                        **fenced(request, attempt_id, data), step=data["step"], state=data["state"]
                    )
                ).data
            ),
            status=201,
        )


class WorkerInterruptApi(WorkerApiView):
    """Stop at a hold point on the latest checkpoint: persist the question, end the attempt.

    ``accepted_schema`` is JSON Schema or the compact form ``{"versions": "string[]"}``;
    an ``auth_required`` request takes ``action`` (tool, target, planned change,
    reversibility) and always the approval schema ``{decision, comment}``.
    """

    idempotency_in_transaction = (
        True  # only rows change: the record joins the service's transaction
    )

    class InputSerializer(FencedInput):
        class Meta:
            ref_name = "WorkerInterruptInput"

        checkpoint_id = serializers.CharField(max_length=40)
        kind = serializers.ChoiceField(choices=RequestKind.choices)
        prompt = serializers.CharField(max_length=10_000)
        accepted_schema = serializers.JSONField(required=False, allow_null=True)
        expires_in = serializers.FloatField(required=False, allow_null=True)
        expires_at = serializers.DateTimeField(required=False, allow_null=True)
        # The metaclass takes declared fields off the class; "context" does not shadow it.
        context = serializers.JSONField(required=False, allow_null=True)  # type: ignore[assignment]
        reason = serializers.CharField(max_length=2000, required=False, allow_blank=True)
        step_id = serializers.CharField(max_length=100, required=False, allow_blank=True)
        action = serializers.JSONField(required=False, allow_null=True)

    @_write_schema(InputSerializer, {201: InputRequestSerializer}, *FENCE_CODES, "stale_checkpoint")
    def post(self, request: Request, attempt_id: str) -> HttpResponse:
        return self.command(
            request,
            lambda data: (
                InputRequestSerializer(
                    services.attempt_interrupt(
                        **fenced(request, attempt_id, data),
                        checkpoint_id=data["checkpoint_id"],
                        kind=data["kind"],
                        prompt=data["prompt"],
                        accepted_schema=data.get("accepted_schema"),
                        expires_in=data.get("expires_in"),
                        expires_at=data.get("expires_at"),
                        context=data.get("context"),
                        reason=data.get("reason", ""),
                        step_id=data.get("step_id", ""),
                        action=data.get("action"),
                    )
                ).data
            ),
            status=201,
        )


class WorkerCompleteApi(WorkerApiView):
    """The attempt finished: record the result; the run succeeds."""

    class InputSerializer(FencedInput):
        class Meta:
            ref_name = "WorkerCompleteInput"

        result = serializers.JSONField(allow_null=True)

    @_write_schema(InputSerializer, {200: RunStateSerializer}, *FENCE_CODES)
    def post(self, request: Request, attempt_id: str) -> HttpResponse:
        return self.command(
            request,
            lambda data: run_state(
                services.attempt_complete(
                    **fenced(request, attempt_id, data), result=data["result"]
                )
            ),
        )


# "class" is a Python keyword, so the error's serializer is built with type().
FailureInput = type(
    "FailureInput",
    (serializers.Serializer,),
    {
        "class": serializers.ChoiceField(
            choices=["transient", "deterministic", "side_effect_unknown", "denied"],
            required=False,
            allow_null=True,
            help_text="Say it when you know it; otherwise the agent's retry policy decides.",
        ),
        "type": serializers.CharField(max_length=200),
        "message": serializers.CharField(max_length=10_000, required=False, allow_blank=True),
        "step": serializers.CharField(max_length=100, required=False, allow_blank=True),
    },
)


class WorkerFailApi(WorkerApiView):
    """The attempt failed: Holdpoint classifies the error, then backs off or stops the run."""

    class InputSerializer(FencedInput):
        class Meta:
            ref_name = "WorkerFailInput"

        error = FailureInput()

    @_write_schema(InputSerializer, {200: RunStateSerializer}, *FENCE_CODES)
    def post(self, request: Request, attempt_id: str) -> HttpResponse:
        return self.command(
            request,
            lambda data: run_state(
                services.attempt_fail(
                    **fenced(request, attempt_id, data), error=dict(data["error"])
                )
            ),
        )
