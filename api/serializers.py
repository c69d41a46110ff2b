"""The JSON representations of docs/api.md (snake_case, times in ISO 8601 UTC).

Output only: each API view validates its input with its own nested ``InputSerializer``.
"""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_EVEN, Context, Decimal
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from runs.agents import AgentSpec, approval_policy_for
from runs.approvals import approvals_needed, policy_of
from runs.models import ApprovalVote, Attempt, Checkpoint, InputRequest, Run, RunEvent
from runs.selectors import run_waiting
from runs.states import RequestKind


class UtcDateTimeField(serializers.DateTimeField):
    """Always UTC with a ``Z``, whatever ``TIME_ZONE`` says."""

    def to_representation(self, value: Any) -> Any:
        return utc(value)


def utc(value: dt.datetime | str | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


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

    def to_representation(self, instance: Attempt) -> dict[str, Any]:
        return attempt_data(instance)

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
    checkpoint_id = serializers.CharField(
        allow_null=True,
        help_text="Null for the pause of a run that never saved one (paused while queued).",
    )
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
        return request_data(instance)


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
            # Whether it counts now: this round's, and not changed since by its author.
            "counts": vote.round == request.edit_round and vote.superseded_at is None,
            "superseded_at": utc(vote.superseded_at) if vote.superseded_at else None,
        }
        for vote in ApprovalVote.objects.select_related("user").filter(request=request)[:100]
    ]
    return {
        "approvals": votes,
        "policy": policy_of(request.policy),
        "approvals_needed": approvals_needed(request),
        "edited": request.edited,
    }


# --- Hot representations ------------------------------------------------------------------------
# A run is the answer of every control operation and of GET /api/runs/{id}. DRF builds a
# serializer's fields (and its nested serializers' fields) for every instance it renders:
# ~0.8 ms of CPU per run on this machine (docs/performance.md). These functions build
# the same dicts directly; the serializers below keep their fields for the schema and
# delegate ``to_representation`` here (tests/api/test_representations.py compares the two).

_SIX_PLACES = Decimal("0.000001")
_COST_CONTEXT = Context(prec=14, rounding=ROUND_HALF_EVEN)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _cost(value: Any) -> str | None:
    """DRF's DecimalField(max_digits=14, decimal_places=6) as a string."""
    if value is None:
        return None
    if not isinstance(value, Decimal):
        value = Decimal(str(value).strip())
    return f"{value.quantize(_SIX_PLACES, context=_COST_CONTEXT):f}"


def attempt_data(attempt: Attempt) -> dict[str, Any]:
    has_error = attempt.error_class or attempt.error_type or attempt.error_message
    return {
        "attempt_id": _text(attempt.id),
        "run_id": attempt.run_id,
        "number": None if attempt.number is None else int(attempt.number),
        "status": _text(attempt.status),
        "reason": _text(attempt.reason),
        "resume_from": _text(attempt.resume_from_id),
        "worker_id": _text(attempt.worker_id),
        "lease_epoch": None if attempt.lease_epoch is None else int(attempt.lease_epoch),
        "cancel_epoch": None if attempt.cancel_epoch is None else int(attempt.cancel_epoch),
        "lease_expires_at": utc(attempt.lease_expires_at),
        "last_heartbeat_at": utc(attempt.last_heartbeat_at),
        "started_at": utc(attempt.started_at),
        "ended_at": utc(attempt.ended_at),
        "error": {
            "class": attempt.error_class,
            "type": attempt.error_type,
            "message": attempt.error_message,
            "fingerprint": attempt.error_fingerprint,
            "step": attempt.error_step,
        }
        if has_error
        else None,
        "cost": _cost(attempt.cost),
        "created_at": utc(attempt.created_at),
    }


def request_data(request: InputRequest) -> dict[str, Any]:
    return {
        "request_id": _text(request.id),
        "run_id": _text(request.run_id),
        "attempt_id": _text(request.attempt_id),
        "checkpoint_id": _text(request.checkpoint_id),
        "kind": _text(request.kind),
        "step_id": _text(request.step_id),
        "reason": _text(request.reason),
        "prompt": _text(request.prompt),
        "accepted_schema": request.accepted_schema,
        "context": request.context,
        "action": request.action,
        "expires_at": utc(request.expires_at),
        "status": _text(request.status),
        "answer": request.answer,
        "answered_by": request.answered_by.get_username() if request.answered_by else None,
        "answered_at": utc(request.answered_at),
        "closed_reason": _text(request.closed_reason),
        "closed_at": utc(request.closed_at),
        "created_at": utc(request.created_at),
        # An approval's decisions so far, its policy and how many approvals it still needs
        # (docs/api.md); an input request has none of these.
        **(approval_facts(request) if request.kind == RequestKind.AUTH_REQUIRED else {}),
    }


_COMPUTE: Any = object()


def waiting_data(waiting: dict[str, Any] | None) -> dict[str, Any] | None:
    """A run's ``waiting`` (``runs.selectors.waiting_for_runs``) with its times in UTC."""
    if waiting is None:
        return None
    return {**waiting, "since": utc(waiting["since"]), "until": utc(waiting["until"])}


def run_data(run: Run, *, waiting: Any = _COMPUTE) -> dict[str, Any]:
    """``RunSerializer(run).data`` without DRF's fields: the answer of every control call.
    ``waiting``: the run's from ``waiting_for_runs`` when the caller read it for a page of
    runs at once; else it is read here (no query unless the run is queued or waiting)."""
    if waiting is _COMPUTE:
        waiting = run_waiting(run)
    attempt = run.current_attempt if run.current_attempt_id is not None else None
    pending = run.pending_request if run.pending_request_id is not None else None
    return {
        "run_id": _text(run.id),
        "agent": _text(run.agent),
        "agent_version": None if run.agent_version is None else int(run.agent_version),
        "status": _text(run.status),
        "failure_class": _text(run.failure_class),
        "failure_detail": _text(run.failure_detail),
        "cancel_epoch": None if run.cancel_epoch is None else int(run.cancel_epoch),
        "lease_epoch": None if run.lease_epoch is None else int(run.lease_epoch),
        "current_attempt": None if attempt is None else attempt_data(attempt),
        "latest_checkpoint_id": _text(run.latest_checkpoint_id),
        "pending_request": None if pending is None else request_data(pending),
        "input": run.input,
        "result": run.result,
        "approvals": None if run.approvals is None else [str(a) for a in run.approvals],
        "cost": _cost(run.cost),
        "cancel_reason": _text(run.cancel_reason),
        "not_before": utc(run.not_before),
        "created_at": utc(run.created_at),
        "updated_at": utc(run.updated_at),
        "finished_at": utc(run.finished_at),
        "waiting": waiting_data(waiting),
    }


class WaitingSerializer(serializers.Serializer):
    reason = serializers.ChoiceField(
        choices=["agent_paused", "backing_off", "no_worker", "ready"],
        help_text="Why the run is not running yet; the first that applies: its agent is "
        "paused, it backs off until `until`, no live worker serves its agent (`since` the "
        "last one's contact, `by` its name), or it is due and waits for a free worker.",
    )
    agent = serializers.CharField()
    since = serializers.CharField(allow_null=True)
    until = serializers.CharField(allow_null=True)
    by = serializers.CharField(allow_null=True, help_text="Who paused the agent; the last worker.")
    detail = serializers.CharField(help_text="Why the agent was paused.")
    workers = serializers.IntegerField(help_text="Live workers that serve the agent.")


@extend_schema_field(WaitingSerializer(allow_null=True))
class WaitingField(serializers.Field):
    """Why a queued (or backing-off) run is not running; null in other states."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(source="*", read_only=True, **kwargs)

    def to_representation(self, value: Run) -> dict[str, Any] | None:
        return waiting_data(run_waiting(value))


class RunSerializer(serializers.ModelSerializer):
    run_id = serializers.CharField(source="id")
    waiting = WaitingField(
        help_text="Why a queued (or backing-off) run is not running; null in other states."
    )
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
            "agent_version",
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
            "waiting",
        ]

    def to_representation(self, instance: Run) -> dict[str, Any]:
        waiting = self.context.get("waiting")
        if waiting is not None and instance.id in waiting:
            return run_data(instance, waiting=waiting[instance.id])
        return run_data(instance)


class RunEventSerializer(serializers.ModelSerializer):
    payload = serializers.JSONField()
    created_at = UtcDateTimeField()

    class Meta:
        model = RunEvent
        fields = ["seq", "type", "actor", "payload", "created_at"]


def checkpoint_data(checkpoint: Checkpoint) -> dict[str, Any]:
    """``CheckpointSerializer(checkpoint).data`` without DRF's fields: every checkpoint a
    worker saves is answered with it (building a model serializer's fields cost more CPU
    than the answer itself, docs/performance.md)."""
    return {
        "checkpoint_id": _text(checkpoint.id),
        "number": int(checkpoint.number),
        "step": _text(checkpoint.step),
        "state": checkpoint.state,
        "attempt_id": _text(checkpoint.attempt_id),
        "created_at": utc(checkpoint.created_at),
    }


class CheckpointSerializer(serializers.ModelSerializer):
    """The schema of a checkpoint; the data is ``checkpoint_data``'s."""

    checkpoint_id = serializers.CharField(source="id")
    attempt_id = serializers.CharField()
    state = serializers.JSONField()
    created_at = UtcDateTimeField()

    class Meta:
        model = Checkpoint
        fields = ["checkpoint_id", "number", "step", "state", "attempt_id", "created_at"]

    def to_representation(self, instance: Checkpoint) -> dict[str, Any]:
        return checkpoint_data(instance)


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
