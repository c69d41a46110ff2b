"""The rest of the worker protocol (docs/protocol.md): everything an in-process agent can
do, over HTTP, for agents in any process and language.

- ``POST /api/worker/claim`` with ``wait``: a long poll. The request waits up to ``wait``
  seconds for an attempt to become due, woken by the same ``NOTIFY holdpoint_work`` the
  in-process workers listen to (``runs/wakeups.py``). The lease also carries the
  ``answers`` a resumed step may use (the matching rule), the run's cost so far and the
  agent version the run started with.
- ``POST /api/worker/attempts/{id}/log``: a line on the run's timeline (fenced).
- ``POST /api/worker/attempts/{id}/cost``: the attempt's cost so far (fenced by the lease).
- ``PUT /api/agents/{name}``: declare an agent (worker token), versioned by input schema.

Same authentication (worker tokens), throttle (``worker`` scope), problem+json errors and
optional Idempotency-Key as the rest of the worker API (``api/worker.py``).
"""

from __future__ import annotations

import time
from typing import Any

from django.db import connection
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.base import BODY_CODES, idempotency_key_parameter, problems, validated
from api.hangup import client_gone
from api.serializers import utc
from api.worker import (
    FENCE_CODES,
    KEY_CODES,
    WORKER_AUTH_CODES,
    LeaseSerializer,
    WorkerApiView,
    lease_data,
    token_id,
)
from ledger.models import Reversibility
from runs import services
from runs.models import Run, WorkerToken
from runs.selectors import answers_on_checkpoint
from runs.wakeups import waiter

# The longest a claim may wait; proxies in front of the API must allow a little more.
MAX_WAIT_SECONDS = 60.0
# While waiting, claim again at least this often (backoffs that come due send no NOTIFY).
POLL_SECONDS = 1.0


def token_name(request: Request) -> str:
    assert isinstance(request.auth, WorkerToken)
    return request.auth.name


# --- The long-polling claim ------------------------------------------------------------------


class AnswerSerializer(serializers.Serializer):
    request_id = serializers.CharField()
    kind = serializers.CharField()
    step_id = serializers.CharField(help_text="The hold-point key the step asked with.")
    answer = serializers.JSONField(allow_null=True)
    answered_by = serializers.CharField(allow_null=True)
    context = serializers.JSONField(help_text="As asked; ``observed`` holds what the step saw.")  # type: ignore[assignment]
    action = serializers.JSONField(help_text="What an approval showed (tool, target, change).")


class FullLeaseSerializer(LeaseSerializer):
    answers = AnswerSerializer(
        many=True,
        help_text="The answers to questions asked on resume_from's checkpoint (empty without "
        "one): a step that asks again with the same key takes the answer instead.",
    )
    run_cost = serializers.CharField(help_text="What the run's earlier attempts cost (decimal).")
    agent_version = serializers.IntegerField(
        allow_null=True, help_text="The declared agent's version the run started with."
    )


def full_lease(lease: services.Lease) -> dict[str, Any]:
    data = lease_data(lease)
    row = Run.objects.filter(pk=lease.run_id).values_list("cost", "agent_version").first()
    data["run_cost"] = str(row[0] if row and row[0] else 0)
    data["agent_version"] = row[1] if row else None
    data["answers"] = (
        answers_on_checkpoint(
            run_id=lease.run_id,
            checkpoint_id=lease.resume_from["checkpoint_id"],
            number=lease.number,
        )
        if lease.resume_from
        else []
    )
    resumed = lease.resume_request
    if (
        resumed
        and resumed.get("step_id")
        and not any(a["request_id"] == resumed["request_id"] for a in data["answers"])
    ):
        data["answers"].append(
            {
                "request_id": resumed["request_id"],
                "kind": resumed["kind"],
                "step_id": resumed["step_id"],
                "answer": resumed.get("answer"),
                "answered_by": resumed.get("answered_by"),
                "context": {},
                "action": resumed.get("action") or {},
            }
        )
    return data


class WorkerClaimWaitApi(WorkerApiView):
    """Lease the next due attempt, waiting up to ``wait`` seconds for one (a long poll).

    204 when nothing came due in time: claim again. The lease carries the checkpoint to
    resume from, the answers its step may use and the run's cost so far."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "WorkerClaimWaitInput"

        worker_id = serializers.CharField(max_length=services.WORKER_ID_MAX_LENGTH)
        agents = serializers.ListField(
            child=serializers.CharField(max_length=100), required=False, max_length=1000
        )
        lease_seconds = serializers.FloatField(min_value=0.1, max_value=3600, required=False)
        wait = serializers.FloatField(
            min_value=0,
            max_value=MAX_WAIT_SECONDS,
            required=False,
            default=0,
            help_text="Seconds to wait for work (long poll); 0 answers at once.",
        )

    @extend_schema(
        tags=["worker"],
        operation_id="worker_claim",
        request=InputSerializer,
        parameters=[idempotency_key_parameter(required=False)],
        responses={
            200: FullLeaseSerializer,
            204: OpenApiResponse(description="No attempt came due within `wait`; claim again."),
            **problems(*WORKER_AUTH_CODES, *BODY_CODES, *KEY_CODES),
        },
    )
    def post(self, request: Request) -> HttpResponse:
        self.idempotency_key(request)
        data = validated(self.InputSerializer, request.data)
        deadline = time.monotonic() + float(data.get("wait") or 0)

        def claim() -> Response:
            while True:
                if client_gone(request):
                    # Hung up while waiting (a worker stopping): lease nothing to nobody.
                    return Response(status=204)
                seen = waiter.generation
                lease = services.attempt_claim(
                    worker_token_id=token_id(request),
                    worker_id=data["worker_id"],
                    agents=data.get("agents") or None,
                    lease_seconds=data.get("lease_seconds"),
                )
                if lease is not None:
                    return Response(full_lease(lease))
                left = deadline - time.monotonic()
                if left <= 0 or waiter.shutting_down.is_set():
                    return Response(status=204)
                # Give the database connection back while waiting: a pool of a few
                # connections (DATABASE_POOL_SIZE) must not be held by idle long polls.
                if not connection.in_atomic_block:
                    connection.close()
                waiter.wait(seen, min(left, POLL_SECONDS))

        return self.idempotent(request, claim)


# --- Log and cost ------------------------------------------------------------------------------


class LogEventSerializer(serializers.Serializer):
    seq = serializers.IntegerField()
    type = serializers.CharField()


class WorkerLogApi(WorkerApiView):
    """Add a line to the run's timeline (event ``agent.log``); fenced like every intention."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "WorkerLogInput"

        lease_epoch = serializers.IntegerField(min_value=0)
        cancel_epoch = serializers.IntegerField(min_value=0)
        message = serializers.CharField(max_length=2000)
        level = serializers.ChoiceField(
            choices=["debug", "info", "warning", "error"], required=False, default="info"
        )
        step = serializers.CharField(max_length=100, required=False, allow_blank=True)
        data = serializers.JSONField(required=False, allow_null=True, help_text="An object.")  # type: ignore[assignment]

    @extend_schema(
        tags=["worker"],
        operation_id="worker_attempts_log",
        request=InputSerializer,
        parameters=[idempotency_key_parameter(required=False)],
        responses={
            201: LogEventSerializer,
            **problems(*WORKER_AUTH_CODES, *BODY_CODES, *KEY_CODES, *FENCE_CODES),
        },
    )
    def post(self, request: Request, attempt_id: str) -> HttpResponse:
        self.idempotency_key(request)
        data = validated(self.InputSerializer, request.data)

        def log() -> Response:
            event = services.attempt_log(
                worker_token_id=token_id(request),
                attempt_id=attempt_id,
                lease_epoch=data["lease_epoch"],
                cancel_epoch=data["cancel_epoch"],
                message=data["message"],
                level=data["level"],
                step=data.get("step", ""),
                data=data.get("data"),
            )
            return Response({"seq": event.seq, "type": event.type}, status=201)

        return self.idempotent(request, log)


class CostSerializer(serializers.Serializer):
    cost = serializers.CharField(help_text="The attempt's cost as recorded (decimal).")
    run_cost = serializers.CharField(help_text="The run's cost, all attempts (decimal).")
    cancel_requested = serializers.BooleanField()
    pause_requested = serializers.BooleanField()


class WorkerCostApi(WorkerApiView):
    """Record the attempt's cost so far (a running total, not an increment). It also renews
    the lease, as a heartbeat does; every other write may carry ``cost`` too."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "WorkerCostInput"

        lease_epoch = serializers.IntegerField(min_value=0)
        cancel_epoch = serializers.IntegerField(min_value=0, required=False)
        cost = serializers.DecimalField(max_digits=18, decimal_places=6, min_value=0)

    @extend_schema(
        tags=["worker"],
        operation_id="worker_attempts_cost",
        request=InputSerializer,
        parameters=[idempotency_key_parameter(required=False)],
        responses={
            200: CostSerializer,
            **problems(*WORKER_AUTH_CODES, *BODY_CODES, *KEY_CODES, *FENCE_CODES),
        },
    )
    def post(self, request: Request, attempt_id: str) -> HttpResponse:
        self.idempotency_key(request)
        data = validated(self.InputSerializer, request.data)

        def cost() -> Response:
            beat = services.attempt_heartbeat(
                worker_token_id=token_id(request),
                attempt_id=attempt_id,
                lease_epoch=data["lease_epoch"],
                cost=str(data["cost"]),
            )
            run_cost = (
                Run.objects.filter(attempts__pk=attempt_id).values_list("cost", flat=True).first()
            )
            return Response(
                {
                    "cost": str(data["cost"]),
                    "run_cost": str(run_cost or 0),
                    "cancel_requested": beat.cancel_requested,
                    "pause_requested": beat.pause_requested,
                }
            )

        return self.idempotent(request, cost)


# --- Watching for cancel and pause ------------------------------------------------------------


class WatchSerializer(serializers.Serializer):
    lease_expires_at = serializers.CharField()
    cancel_requested = serializers.BooleanField()
    pause_requested = serializers.BooleanField()


MAX_WATCH_SECONDS = 60.0


class WorkerWatchApi(WorkerApiView):
    """A heartbeat that waits: renew the lease, then hold the request up to ``wait``
    seconds until the run is cancelled or paused (the same NOTIFY that stops an in-process
    worker at once), and answer as a heartbeat does. Called in a loop with ``wait`` = the
    heartbeat interval, it renews the lease as often and hears a cancel at once."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "WorkerWatchInput"

        lease_epoch = serializers.IntegerField(min_value=0)
        lease_seconds = serializers.FloatField(min_value=0.1, max_value=3600, required=False)
        cost = serializers.DecimalField(
            max_digits=18, decimal_places=6, min_value=0, required=False, allow_null=True
        )
        wait = serializers.FloatField(min_value=0, max_value=MAX_WATCH_SECONDS, default=0)

    @extend_schema(
        tags=["worker"],
        operation_id="worker_attempts_watch",
        request=InputSerializer,
        responses={
            200: WatchSerializer,
            **problems(
                *WORKER_AUTH_CODES, *BODY_CODES, "stale_worker", "not_your_lease", "not_found"
            ),
        },
    )
    def post(self, request: Request, attempt_id: str) -> HttpResponse:
        data = validated(self.InputSerializer, request.data)
        cost = data.get("cost")

        def beat() -> services.Heartbeat:
            return services.attempt_heartbeat(
                worker_token_id=token_id(request),
                attempt_id=attempt_id,
                lease_epoch=data["lease_epoch"],
                lease_seconds=data.get("lease_seconds"),
                cost=str(cost) if cost is not None else None,
            )

        # Count the signals before the heartbeat reads the run: one that comes in between
        # is not lost (the wait returns at once).
        run_id = Run.objects.filter(attempts__pk=attempt_id).values_list("pk", flat=True).first()
        keys = (attempt_id, run_id) if run_id else (attempt_id,)
        seen = waiter.signals(keys)
        heartbeat = beat()
        if not (heartbeat.cancel_requested or heartbeat.pause_requested) and data["wait"] > 0:
            if not connection.in_atomic_block:
                connection.close()  # no database connection held while waiting
            waiter.wait_signal(keys, seen, data["wait"])
            heartbeat = beat()
        return Response(
            {
                "lease_expires_at": utc(heartbeat.lease_expires_at),
                "cancel_requested": heartbeat.cancel_requested,
                "pause_requested": heartbeat.pause_requested,
            }
        )


# --- Declaring an agent ------------------------------------------------------------------------


class ToolDeclarationSerializer(serializers.Serializer):
    name = serializers.RegexField(r"^[-a-zA-Z0-9_]{1,100}$", max_length=100)
    reversibility = serializers.ChoiceField(choices=Reversibility.choices, required=False)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)


class ApprovalPolicySerializer(serializers.Serializer):
    ask_before = serializers.ListField(
        child=serializers.CharField(max_length=100),
        max_length=50,
        required=False,
        help_text="Tools whose every call asks a person first (an approval hold point).",
    )
    # Who may decide, and how many (docs/agents.md, approval policies); checked by the
    # run store (runs/approvals.py parse_policy), the same policy as a Python agent's.
    groups = serializers.ListField(
        child=serializers.CharField(max_length=150), max_length=50, required=False
    )
    # The metaclass takes declared fields off the class; "required" does not shadow it.
    required = serializers.IntegerField(required=False, help_text="Distinct approvers needed.")  # type: ignore[assignment]
    self_approval = serializers.BooleanField(required=False, allow_null=True)
    any_deny_closes = serializers.BooleanField(required=False)
    escalation = serializers.JSONField(required=False, allow_null=True)
    remind = serializers.FloatField(required=False, allow_null=True)
    rules = serializers.ListField(child=serializers.JSONField(), max_length=50, required=False)


class AgentDeclarationSerializer(serializers.Serializer):
    name = serializers.CharField()
    version = serializers.IntegerField()
    created = serializers.BooleanField()
    new_version = serializers.BooleanField(
        help_text="The input schema changed: runs started from now on use this version."
    )
    input_schema = serializers.JSONField()
    retry_policy = serializers.JSONField()
    label = serializers.CharField()  # type: ignore[assignment]
    description = serializers.CharField()
    approval_policy = serializers.JSONField()
    tools = ToolDeclarationSerializer(many=True)


class AgentDeclareApi(WorkerApiView):
    """Declare an agent served by remote workers, or update its declaration.

    A declaration whose input schema differs from the current version's makes a new
    version (201 on the first declaration, else 200); runs keep the version they
    started with. Tools name where a side effect goes and how far it can be undone; the
    ledger decides for them, the agent's process acts."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "AgentDeclareInput"

        input_schema = serializers.JSONField(
            required=False, help_text="JSON Schema or the compact form."
        )
        retry_policy = serializers.JSONField(required=False, help_text="RetryPolicy fields.")
        label = serializers.CharField(  # type: ignore[assignment]
            max_length=200,
            required=False,
            allow_blank=True,
            help_text='A template over the input: "Migrate {service}".',
        )
        description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
        tools = serializers.ListField(
            child=ToolDeclarationSerializer(), required=False, max_length=50
        )
        approval_policy = ApprovalPolicySerializer(required=False)

    @extend_schema(
        tags=["worker"],
        operation_id="agents_declare",
        request=InputSerializer,
        parameters=[idempotency_key_parameter(required=False)],
        responses={
            200: AgentDeclarationSerializer,
            201: AgentDeclarationSerializer,
            **problems(*WORKER_AUTH_CODES, *BODY_CODES, *KEY_CODES, "invalid_state"),
        },
    )
    def put(self, request: Request, name: str) -> HttpResponse:
        self.idempotency_key(request)
        data = validated(self.InputSerializer, request.data)

        def declare() -> Response:
            declared = services.agent_declare(
                name=name,
                actor=f"worker:{token_name(request)}",
                input_schema=data.get("input_schema"),
                retry_policy=data.get("retry_policy"),
                label=data.get("label", ""),
                description=data.get("description", ""),
                tools=[dict(t) for t in data.get("tools", [])],
                approval_policy=dict(data["approval_policy"])
                if data.get("approval_policy")
                else None,
            )
            agent = declared.agent
            return Response(
                {
                    "name": agent.name,
                    "version": agent.version,
                    "created": declared.created,
                    "new_version": declared.new_version,
                    "input_schema": agent.input_schema,
                    "retry_policy": agent.retry_policy,
                    "label": agent.label,
                    "description": agent.description,
                    "approval_policy": agent.approval_policy,
                    "tools": agent.tool_declarations,
                },
                status=201 if declared.created else 200,
            )

        return self.idempotent(request, declare)
