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

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.base import BODY_CODES, idempotency_key_parameter, problems, validated
from api.hangup import client_gone
from api.problems import error_body
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
from api.worker_identity import identity_from_claim, record_identity
from ledger.models import Reversibility
from runs import services
from runs.db import db_now
from runs.errors import HoldpointError
from runs.models import Attempt, Run, WorkerToken
from runs.ratelimit import client_address
from runs.selectors import answers_for_lease
from runs.tokens import serving_for
from runs.wakeups import waiter

# The longest a claim may wait; proxies in front of the API must allow a little more.
MAX_WAIT_SECONDS = 60.0
# While waiting, claim again at least this often (backoffs that come due send no NOTIFY).
POLL_SECONDS = 1.0


def token_name(request: Request) -> str:
    return worker_token(request).name


def worker_token(request: Request) -> WorkerToken:
    assert isinstance(request.auth, WorkerToken)
    return request.auth


# --- The long-polling claim ------------------------------------------------------------------


class _Waiting:
    """How many long-polling claims wait in this process, per token and per address. A
    claim that would go past ``HOLDPOINT_WAITING_CLAIMS_PER_TOKEN`` or ``…_PER_ADDRESS`` is
    answered 429 at once instead: each waiting claim holds a thread and a claim query a
    second, and one token (or one host) must not take them all from everyone else."""

    RETRY_AFTER = 2

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    @contextlib.contextmanager
    def slot(self, token: str, address: str) -> Iterator[None]:
        caps = (
            (f"token:{token}", int(settings.HOLDPOINT_WAITING_CLAIMS_PER_TOKEN), "worker token"),
            (f"address:{address}", int(settings.HOLDPOINT_WAITING_CLAIMS_PER_ADDRESS), "address"),
        )
        with self._lock:
            for key, cap, what in caps:
                if cap and self._counts[key] >= cap:
                    raise exceptions.Throttled(
                        wait=self.RETRY_AFTER,
                        detail=f"Too many claims of this {what} are waiting already ({cap}); "
                        f"claim again in {self.RETRY_AFTER} seconds.",
                    )
            for key, _cap, _what in caps:
                self._counts[key] += 1
        try:
            yield
        finally:
            with self._lock:
                for key, _cap, _what in caps:
                    self._counts[key] -= 1
                    if self._counts[key] <= 0:
                        del self._counts[key]


waiting_claims = _Waiting()


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
    # Both read off the row the claim locked (runs.services.Lease): no query again.
    data["run_cost"] = str(lease.run_cost or 0)
    data["agent_version"] = lease.agent_version
    data["answers"] = answers_for_lease(lease)
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
            **problems(*WORKER_AUTH_CODES, *BODY_CODES, *KEY_CODES, "agent_not_yours"),
            # (throttled, 429, is among WORKER_AUTH_CODES: too many claims of the token or
            # address wait already)
        },
    )
    def post(self, request: Request) -> HttpResponse:
        self.idempotency_key(request)
        data = validated(self.InputSerializer, request.data)
        if getattr(request, "worker_identity", None) is None:
            # No identity headers: the claim's worker_id names the worker.
            with contextlib.suppress(HoldpointError):
                record_identity(identity_from_claim(request, data))
        deadline = time.monotonic() + float(data.get("wait") or 0)
        # What this token may serve, read once for the whole wait: a worker that asks for
        # an agent outside it is told so, not left waiting for work it will never get.
        serving = serving_for(worker_token(request))
        refused = [(a, serving.why_not(a)) for a in data.get("agents") or []]
        refused = [(a, why) for a, why in refused if why]
        if refused:
            raise HoldpointError(
                "agent_not_yours",
                " ".join(why for _a, why in refused if why),
                agents=[a for a, _why in refused],
            )

        asked = frozenset(data.get("agents") or ())

        def accepts(agent: str) -> bool:
            """Whether this claim may take an attempt of ``agent`` (which claim a notice wakes)."""
            return (not asked or agent in asked) and serving.why_not(agent) is None

        def claim() -> Response:
            if float(data.get("wait") or 0) <= 0:
                return Response(status=204) if client_gone(request) else look()
            with (
                waiting_claims.slot(token_name(request), client_address(request)),
                waiter.waiting(accepts) as ticket,
            ):
                while True:
                    if client_gone(request):
                        # Hung up while waiting (a worker stopping): lease nothing to nobody.
                        return Response(status=204)
                    waiter.looking(ticket)
                    answer = look()
                    if answer.status_code == 200:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0 or waiter.shutting_down.is_set():
                        return Response(status=204)
                    # Give the database connection back while waiting: a pool of a few
                    # connections (DATABASE_POOL_SIZE) must not be held by idle long polls.
                    if not connection.in_atomic_block:
                        connection.close()
                    waiter.wait_ticket(ticket, min(left, POLL_SECONDS))
            # One notice may stand for several due attempts: the next waiting claim of the
            # agent looks too (runs/wakeups.py). Woken after this claim's ticket is gone, so
            # the wake-up goes to another claim, not back to this one.
            waiter.wake_one(answer.data["agent"])
            return answer

        def look() -> Response:
            lease = services.attempt_claim(
                worker_token_id=token_id(request),
                worker_id=data["worker_id"],
                agents=data.get("agents") or None,
                lease_seconds=data.get("lease_seconds"),
                serving=serving,
            )
            if lease is None:
                return Response(status=204)
            return Response(full_lease(lease))

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
    lease_seconds_left = serializers.FloatField(
        help_text="Seconds the lease has left when the answer is sent, on the server's clock. "
        "A client counts them from when the answer arrives, on its own monotonic clock, "
        "and never compares lease_expires_at with its own wall clock."
    )
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
        # The lease's own clock (the database's, runs/db.py) says what is left of it: a
        # worker's clock may be seconds off, and the watch was held for a while, so neither
        # the expiry nor the time the request was sent can date the renewal for the worker.
        left = (heartbeat.lease_expires_at - db_now()).total_seconds()
        return Response(
            {
                "lease_expires_at": utc(heartbeat.lease_expires_at),
                "lease_seconds_left": round(max(0.0, left), 3),
                "cancel_requested": heartbeat.cancel_requested,
                "pause_requested": heartbeat.pause_requested,
            }
        )


# --- One renewal for all of a worker's attempts ------------------------------------------------


class BeatInputSerializer(serializers.Serializer):
    attempt_id = serializers.CharField(max_length=40)
    lease_epoch = serializers.IntegerField(min_value=0)
    cost = serializers.DecimalField(
        max_digits=18, decimal_places=6, min_value=0, required=False, allow_null=True
    )


class BeatSerializer(serializers.Serializer):
    attempt_id = serializers.CharField()
    ok = serializers.BooleanField(help_text="Renewed; false: see ``problem``.")
    lease_expires_at = serializers.CharField(required=False)
    lease_seconds_left = serializers.FloatField(required=False)
    cancel_requested = serializers.BooleanField(required=False)
    pause_requested = serializers.BooleanField(required=False)
    problem = serializers.JSONField(
        required=False,
        help_text="Why this attempt was not renewed, as problem+json would say it "
        "(stale_worker, not_your_lease, not_found: let the attempt go).",
    )


class BeatsSerializer(serializers.Serializer):
    attempts = BeatSerializer(many=True, help_text="One answer per attempt, in the order asked.")


class WorkerHeartbeatsApi(WorkerApiView):
    """Renew the leases of several attempts at once: one call per worker process and
    interval, however many attempts it runs (``--concurrency``). Each attempt is fenced on
    its own, as ``…/heartbeat`` fences it, and answered in its place: a refused one (a
    stale ``lease_epoch``, another token's attempt) gets its ``problem`` and changes
    nothing; the others are renewed. With ``wait``, the answer is held like a watch's until
    an attempt that was quiet is cancelled or paused, or ``wait`` is over (then renewed
    again). Not keyed: a renewal repeated renews again (an ``Idempotency-Key`` is ignored,
    as the watch ignores it)."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "WorkerHeartbeatsInput"

        attempts = serializers.ListField(
            child=BeatInputSerializer(),
            min_length=1,
            max_length=services.MAX_HEARTBEAT_BATCH,
            help_text=f"At most {services.MAX_HEARTBEAT_BATCH}, each attempt once.",
        )
        lease_seconds = serializers.FloatField(min_value=0.1, max_value=3600, required=False)
        wait = serializers.FloatField(min_value=0, max_value=MAX_WATCH_SECONDS, default=0)

    @extend_schema(
        tags=["worker"],
        operation_id="worker_heartbeat",
        request=InputSerializer,
        responses={200: BeatsSerializer, **problems(*WORKER_AUTH_CODES, *BODY_CODES)},
    )
    def post(self, request: Request) -> HttpResponse:
        raw = request.data.get("attempts") if isinstance(request.data, dict) else None
        if isinstance(raw, list) and len(raw) > services.MAX_HEARTBEAT_BATCH:
            # Before the entries are validated one by one: a long list costs nothing.
            raise HoldpointError(
                "invalid_input",
                f"A batch renews at most {services.MAX_HEARTBEAT_BATCH} attempts; "
                "send the rest in another.",
                errors=[
                    {
                        "pointer": "/attempts",
                        "message": f"At most {services.MAX_HEARTBEAT_BATCH} entries.",
                    }
                ],
            )
        data = validated(self.InputSerializer, request.data)
        beats = [
            (
                str(b["attempt_id"]),
                int(b["lease_epoch"]),
                None if b.get("cost") is None else str(b["cost"]),
            )
            for b in data["attempts"]
        ]
        ids = [attempt_id for attempt_id, _epoch, _cost in beats]
        if len(set(ids)) != len(ids):
            raise HoldpointError(
                "invalid_input",
                "Each attempt may be named once in a batch.",
                errors=[{"pointer": "/attempts", "message": "An attempt_id is repeated."}],
            )

        def renew() -> list[services.Heartbeat | HoldpointError]:
            return services.attempts_heartbeat(
                beats=beats,
                lease_seconds=data.get("lease_seconds"),
                worker_token_id=token_id(request),
            )

        wait = float(data["wait"])
        keys: dict[str, tuple[str, ...]] = {}
        seen: dict[str, int] = {}
        if wait > 0:
            # Count each attempt's signals before the renewal reads the runs: one that comes
            # in between is not lost (the wait returns at once).
            for attempt_id, run_id in Attempt.objects.filter(pk__in=ids).values_list(
                "pk", "run_id"
            ):
                keys[attempt_id] = (attempt_id, run_id)
                seen[attempt_id] = waiter.signals(keys[attempt_id])
        answers = renew()
        # Held for the attempts that were quiet (renewed, neither cancelled nor paused): a
        # signal the worker already heard, or a refusal, must not answer every call at once.
        quiet = [
            i
            for i, a in zip(ids, answers, strict=True)
            if isinstance(a, services.Heartbeat)
            and not (a.cancel_requested or a.pause_requested)
            and i in keys
        ]
        if wait > 0 and quiet:
            if not connection.in_atomic_block:
                connection.close()  # no database connection held while waiting
            waiter.wait_signal(
                tuple(k for i in quiet for k in keys[i]), sum(seen[i] for i in quiet), wait
            )
            answers = renew()
        return Response({"attempts": [_beat(i, a) for i, a in zip(ids, answers, strict=True)]})


def _beat(attempt_id: str, answer: services.Heartbeat | HoldpointError) -> dict[str, Any]:
    if isinstance(answer, HoldpointError):
        return {"attempt_id": attempt_id, "ok": False, "problem": error_body(answer)}
    # On the database's clock, as the renewal read it (runs/db.py): the renewal is the
    # last thing before the answer, so no statement is spent asking the clock again.
    assert answer.renewed_at is not None
    left = (answer.lease_expires_at - answer.renewed_at).total_seconds()
    return {
        "attempt_id": attempt_id,
        "ok": True,
        "lease_expires_at": utc(answer.lease_expires_at),
        "lease_seconds_left": round(max(0.0, left), 3),
        "cancel_requested": answer.cancel_requested,
        "pause_requested": answer.pause_requested,
    }


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
            **problems(
                *WORKER_AUTH_CODES, *BODY_CODES, *KEY_CODES, "invalid_state", "agent_not_yours"
            ),
        },
    )
    def put(self, request: Request, name: str) -> HttpResponse:
        self.idempotency_key(request)
        data = validated(self.InputSerializer, request.data)

        def declare() -> Response:
            declared = services.agent_declare(
                name=name,
                actor=f"worker:{token_name(request)}",
                serving=serving_for(worker_token(request)),
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
