"""The JSON representations of docs/api.md (snake_case, times in ISO 8601 UTC).

Output only: each API view validates its input with its own nested ``InputSerializer``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from runs.agents import AgentSpec, approval_policy_for
from runs.approvals import approvals_needed, policy_of
from runs.models import ApprovalVote, Attempt, Checkpoint, InputRequest, Run, RunEvent
from runs.states import RequestKind


class UtcDateTimeField(serializers.DateTimeField):
    """Always UTC with a ``Z``, whatever ``TIME_ZONE`` says."""

    def to_representation(self, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, str):
            return value
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def utc(value: dt.datetime | None) -> str | None:
    return UtcDateTimeField().to_representation(value)


# "class" is a Python keyword, so this serializer is built with type(); it only documents
# the shape of ``attempt.error`` in the schema.
AttemptErrorSerializer = type(
    "AttemptErrorSerializer",
    (serializers.Serializer,),
    {
        "class": serializers.CharField(help_text="Failure class: transient, deterministic, …"),
        "type": serializers.CharField(),
        "message": serializers.CharField(),
        "fingerprint": serializers.CharField(),
        "step": serializers.CharField(),
    },
)


class AttemptSerializer(serializers.ModelSerializer):
    attempt_id = serializers.CharField(source="id")
    resume_from = serializers.CharField(source="resume_from_id", allow_null=True)
    lease_expires_at = UtcDateTimeField(allow_null=True)
    last_heartbeat_at = UtcDateTimeField(allow_null=True)
    started_at = UtcDateTimeField(allow_null=True)
    ended_at = UtcDateTimeField(allow_null=True)
    created_at = UtcDateTimeField()
    error = serializers.SerializerMethodField()

    class Meta:
        model = Attempt
        fields = [
            "attempt_id",
            "run_id",
            "number",
            "status",
            "reason",
            "resume_from",
            "worker_id",
            "lease_epoch",
            "cancel_epoch",
            "lease_expires_at",
            "last_heartbeat_at",
            "started_at",
            "ended_at",
            "error",
            "cost",
            "created_at",
        ]

    @extend_schema_field(AttemptErrorSerializer(allow_null=True))
    def get_error(self, attempt: Attempt) -> dict[str, str] | None:
        if not (attempt.error_class or attempt.error_type or attempt.error_message):
            return None
        return {
            "class": attempt.error_class,
            "type": attempt.error_type,
            "message": attempt.error_message,
            "fingerprint": attempt.error_fingerprint,
            "step": attempt.error_step,
        }


class InputRequestSerializer(serializers.ModelSerializer):
    request_id = serializers.CharField(source="id")
    run_id = serializers.CharField()
    attempt_id = serializers.CharField()
    checkpoint_id = serializers.CharField()
    accepted_schema = serializers.JSONField()
    # DRF takes declared fields off the class, so these names shadow nothing at run time.
    context = serializers.JSONField()  # type: ignore[assignment]
    action = serializers.JSONField()
    answer = serializers.JSONField(allow_null=True)
    answered_by = serializers.SerializerMethodField()
    expires_at = UtcDateTimeField()
    answered_at = UtcDateTimeField(allow_null=True)
    closed_at = UtcDateTimeField(allow_null=True)
    created_at = UtcDateTimeField()

    class Meta:
        model = InputRequest
        fields = [
            "request_id",
            "run_id",
            "attempt_id",
            "checkpoint_id",
            "kind",
            "step_id",
            "reason",
            "prompt",
            "accepted_schema",
            "context",
            "action",
            "expires_at",
            "status",
            "answer",
            "answered_by",
            "answered_at",
            "closed_reason",
            "closed_at",
            "created_at",
        ]

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_answered_by(self, request: InputRequest) -> str | None:
        return request.answered_by.get_username() if request.answered_by else None

    def to_representation(self, instance: InputRequest) -> dict[str, Any]:
        data = super().to_representation(instance)
        # An approval's decisions so far, its policy and how many approvals it still needs
        # (docs/api.md); an input request has none of these.
        if instance.kind == RequestKind.AUTH_REQUIRED:
            data.update(approval_facts(instance))
        return data


def approval_facts(request: InputRequest) -> dict[str, Any]:
    """An approval's ``approvals`` (every decision so far), ``policy``, ``approvals_needed``
    and ``edited`` (the arguments as edited so far; null when nobody edited them)."""
    votes = [
        {
            "by": vote.user.get_username() if vote.user is not None else vote.actor,
            "decision": vote.decision,
            "comment": vote.comment,
            "edited": vote.edited,
            "at": utc(vote.created_at),
            "counts": vote.round == request.edit_round,
        }
        for vote in ApprovalVote.objects.select_related("user").filter(request=request)[:100]
    ]
    return {
        "approvals": votes,
        "policy": policy_of(request.policy),
        "approvals_needed": approvals_needed(request),
        "edited": request.edited,
    }


class RunSerializer(serializers.ModelSerializer):
    run_id = serializers.CharField(source="id")
    current_attempt = AttemptSerializer(allow_null=True)
    latest_checkpoint_id = serializers.CharField(allow_null=True)
    pending_request = InputRequestSerializer(allow_null=True)
    input = serializers.JSONField()
    result = serializers.JSONField(allow_null=True)
    approvals = serializers.ListField(child=serializers.CharField())
    not_before = UtcDateTimeField(allow_null=True)
    created_at = UtcDateTimeField()
    updated_at = UtcDateTimeField()
    finished_at = UtcDateTimeField(allow_null=True)

    class Meta:
        model = Run
        fields = [
            "run_id",
            "agent",
            "status",
            "failure_class",
            "failure_detail",
            "cancel_epoch",
            "lease_epoch",
            "current_attempt",
            "latest_checkpoint_id",
            "pending_request",
            "input",
            "result",
            "approvals",
            "cost",
            "cancel_reason",
            "not_before",
            "created_at",
            "updated_at",
            "finished_at",
        ]


class RunEventSerializer(serializers.ModelSerializer):
    payload = serializers.JSONField()
    created_at = UtcDateTimeField()

    class Meta:
        model = RunEvent
        fields = ["seq", "type", "actor", "payload", "created_at"]


class CheckpointSerializer(serializers.ModelSerializer):
    checkpoint_id = serializers.CharField(source="id")
    attempt_id = serializers.CharField()
    state = serializers.JSONField()
    created_at = UtcDateTimeField()

    class Meta:
        model = Checkpoint
        fields = ["checkpoint_id", "number", "step", "state", "attempt_id", "created_at"]


class AgentSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    source = serializers.ChoiceField(choices=["python", "declared"])  # type: ignore[assignment]
    input_schema = serializers.JSONField()
    retry_policy = serializers.SerializerMethodField()
    tools = serializers.ListField(child=serializers.CharField())

    @extend_schema_field(serializers.DictField())
    def get_retry_policy(self, spec: AgentSpec) -> dict[str, Any]:
        return spec.retry_policy.as_dict()


class ProblemErrorSerializer(serializers.Serializer):
    pointer = serializers.CharField(help_text="JSON pointer to the failing value.")
    message = serializers.CharField()


class ProblemSerializer(serializers.Serializer):
    """RFC 9457 problem details with Holdpoint's ``code``; errors carry more facts."""

    type = serializers.CharField(help_text="urn:holdpoint:problem:<code>")
    title = serializers.CharField()
    status = serializers.IntegerField()
    detail = serializers.CharField()
    code = serializers.CharField(help_text="Stable machine-readable code.")
    instance = serializers.CharField(required=False, help_text="The request path.")
    errors = ProblemErrorSerializer(many=True, required=False)  # type: ignore[assignment]


class AgentOverviewSerializer(serializers.Serializer):
    """An agent with its gate (the kill switch) and its runs: ``GET /api/agents``."""

    name = serializers.CharField()
    description = serializers.CharField(source="spec.description")
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=["python", "declared"], source="spec.source"
    )
    input_schema = serializers.JSONField(source="spec.input_schema")
    version = serializers.IntegerField(
        source="spec.version",
        allow_null=True,
        help_text="A declared agent's current version (PUT /api/agents/{name}); null for Python.",
    )
    retry_policy = serializers.SerializerMethodField()
    tools = serializers.ListField(child=serializers.CharField(), source="spec.tools")
    state = serializers.ChoiceField(choices=["open", "paused"])
    paused_by = serializers.CharField(allow_null=True)
    pause_reason = serializers.CharField(allow_null=True)
    paused_since = UtcDateTimeField(allow_null=True)
    held_runs = serializers.IntegerField(help_text="Queued or backing-off runs the gate holds.")
    running_attempts = serializers.IntegerField()
    runs_by_status = serializers.DictField(child=serializers.IntegerField())
    approval_policy = serializers.SerializerMethodField(
        help_text="The agent's approval policy (`policy`) and where it comes from (`source`: "
        "operator, code or default); docs/agents.md."
    )

    @extend_schema_field(serializers.DictField())
    def get_approval_policy(self, row: dict[str, Any]) -> dict[str, Any]:
        policy, source = approval_policy_for(row["name"])
        return {"policy": policy, "source": source}

    @extend_schema_field(serializers.DictField())
    def get_retry_policy(self, row: dict[str, Any]) -> dict[str, Any]:
        return row["spec"].retry_policy.as_dict()
