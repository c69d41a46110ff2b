"""The run store. Only ``runs.services`` writes these rows.

All writes that concern one run happen under a row lock on that ``Run``
(``select_for_update``): the run row is *the* lock for its attempts, checkpoints,
requests and events, so there is one lock order and no deadlock between them.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Exists, OuterRef, Q

from runs.audit import AUDIT_EVENT_TYPES
from runs.ids import new_attempt_id, new_checkpoint_id, new_request_id, new_run_id
from runs.states import (
    CLAIMABLE,
    AttemptReason,
    AttemptStatus,
    FailureClass,
    RequestKind,
    RequestStatus,
    RunStatus,
)


class DeclaredAgent(models.Model):
    """An agent served by an HTTP worker (any language), declared by name.

    Python agents live in the in-process registry; both are accepted by ``run_start``.
    """

    name = models.SlugField(max_length=100, primary_key=True)
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict, blank=True)
    retry_policy = models.JSONField(default=dict, blank=True)
    tools = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Declared over the worker API (``PUT /api/agents/{name}``): the current version, the
    # label template, the approval policy and each tool's reversibility (docs/protocol.md).
    version = models.PositiveIntegerField(default=1)
    label = models.CharField(max_length=200, blank=True)
    approval_policy = models.JSONField(default=dict, blank=True)
    tool_declarations = models.JSONField(default=list, blank=True)
    declared_by = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True, null=True)
    # The worker tokens (by name) it belongs to: the one that first declared it, or whom an
    # administrator moved it to. Only they may declare it again and claim its runs; empty
    # for an agent an administrator declared (``manage.py agent declare``), which no token
    # may re-declare (runs/tokens.py).
    owners = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return self.name


class AgentVersion(models.Model):
    """One version of a declared agent. A declaration that changes the input schema makes
    a new version; other changes update the current one. A run keeps the version it was
    started with (``Run.agent_version``)."""

    agent = models.CharField(max_length=100)
    version = models.PositiveIntegerField()
    input_schema = models.JSONField(default=dict, blank=True)
    retry_policy = models.JSONField(default=dict, blank=True)
    label = models.CharField(max_length=200, blank=True)
    approval_policy = models.JSONField(default=dict, blank=True)
    tool_declarations = models.JSONField(default=list, blank=True)
    description = models.TextField(blank=True)
    declared_by = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent", "version"], name="agentversion_unique")
        ]

    def __str__(self) -> str:
        return f"{self.agent} v{self.version}"


class AgentGate(models.Model):
    """The kill switch of one agent: while ``paused``, nothing of the agent is claimed and
    its running attempts stop at their next step boundary (docs/architecture.md, the run model).

    One row per agent that was ever paused. ``attempt_claim`` reads it in its SQL (a
    ``NOT EXISTS``) and then takes it ``FOR SHARE``, so a claim and a pause of the same
    agent serialise on this row: a claim either commits before the pause (and the pause
    tells its worker) or sees the gate closed.
    """

    agent = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(default=False)
    reason = models.TextField(blank=True)
    actor = models.CharField(max_length=200, blank=True)
    paused_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    paused_at = models.DateTimeField(null=True, blank=True)
    unpaused_at = models.DateTimeField(null=True, blank=True)
    unpaused_by = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        permissions = [("pause_agent", "Can pause and unpause a whole agent")]
        constraints = [
            models.CheckConstraint(
                condition=Q(paused=False) | Q(paused_at__isnull=False),
                name="agentgate_paused_has_time",
            )
        ]

    def __str__(self) -> str:
        return f"{self.agent} ({'paused' if self.paused else 'open'})"


class Run(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_run_id, editable=False)
    agent = models.CharField(max_length=100)
    # The version of a declared agent the run started with (None: a Python agent).
    agent_version = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    failure_class = models.CharField(max_length=30, choices=FailureClass.choices, blank=True)
    failure_detail = models.TextField(blank=True)
    input = models.JSONField(default=dict, blank=True)
    result = models.JSONField(null=True, blank=True)
    # Steps whose approval was given when the run was started (DESIGN 11: approval before the
    # irreversible, "unless the agent was started with that approval given").
    approvals = models.JSONField(default=list, blank=True)
    cancel_epoch = models.PositiveIntegerField(default=0)
    lease_epoch = models.PositiveIntegerField(default=0)
    # The seq of the newest RunEvent; the next event takes seq + 1 under the run lock.
    last_event_seq = models.PositiveIntegerField(default=0)
    current_attempt = models.ForeignKey(
        "Attempt", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    latest_checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    pending_request = models.ForeignKey(
        "InputRequest", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # When the current attempt may be claimed (backoff); claims read it through the index below.
    not_before = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.TextField(blank=True)
    # Steps before which the run pauses every time it reaches them (breakpoints).
    pause_before = models.JSONField(default=list, blank=True)
    # The pause asked while a worker held the lease (pause_requested): who, why and when.
    # The pause request that the run holds once paused is made from these.
    pause_reason = models.TextField(blank=True)
    pause_actor = models.CharField(max_length=200, blank=True)
    pause_requested_at = models.DateTimeField(null=True, blank=True)
    pause_expires_in = models.FloatField(null=True, blank=True)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set when the retention sweep removed this finished run's events and checkpoints.
    history_purged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        permissions = [
            ("answer_run", "Can answer input requests"),
            ("approve_run", "Can approve or deny risky actions"),
            ("cancel_run", "Can cancel runs"),
            ("retry_run", "Can retry runs"),
            ("start_run", "Can start runs"),
        ]
        indexes = [
            # Serves attempt_claim: WHERE status IN ('queued','waiting') AND not_before <= now
            # ORDER BY not_before ... FOR UPDATE SKIP LOCKED. Partial, so it holds only work.
            models.Index(
                fields=["not_before"],
                name="run_claimable_idx",
                condition=Q(status__in=sorted(CLAIMABLE)),
            ),
            # Serves the runs list: filter by status, newest first.
            models.Index(fields=["status", "-created_at"], name="run_status_created_idx"),
            models.Index(fields=["agent", "-created_at"], name="run_agent_created_idx"),
            models.Index(fields=["-created_at"], name="run_created_idx"),
            # Serves history_purge: finished runs whose history is still there, oldest first.
            models.Index(
                fields=["finished_at"],
                name="run_finished_unpurged_idx",
                condition=Q(
                    status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED],
                    history_purged_at__isnull=True,
                ),
            ),
            # Serves the operations page's rollup (runs/stats.py ``stats_rollup``): runs
            # WHERE finished_at >= the first open hour, grouped by hour, agent and outcome.
            models.Index(
                fields=["finished_at"],
                name="run_finished_idx",
                condition=Q(finished_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def label(self) -> str:
        """How people call the run (``runs.agents.run_label``): not stored, so an agent's
        new template names its old runs too."""
        from runs.agents import run_label

        return run_label(self.agent, self.input, self.id)


class Checkpoint(models.Model):
    """An immutable snapshot of agent state at a step boundary, naming the next step."""

    # Not a column: set by ``checkpoint_save`` on the row it returns, so the worker learns at
    # the boundary itself that it must stop there (a run pause, or its agent's gate).
    pause_requested: bool = False

    id = models.CharField(
        primary_key=True, max_length=40, default=new_checkpoint_id, editable=False
    )
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    attempt = models.ForeignKey("Attempt", on_delete=models.CASCADE, related_name="checkpoints")
    number = models.PositiveIntegerField()
    step = models.CharField(max_length=100)
    state = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="checkpoint_run_number_uniq")
        ]
        ordering = ["run", "number"]

    def __str__(self) -> str:
        return self.id


def claimable_q(due: Any = None) -> Q:
    """Runs whose current attempt a worker may claim: the one rule, used by the claim and by
    the workers' "when is the next one due" (both served by ``run_claimable_idx``). With
    ``due`` (a time, or ``Now()`` to read the clock in the claim's own statement), only those
    due by then. A run of an agent whose gate is closed (the kill switch, ``AgentGate``) is
    never claimable: the claim's own SQL says NOT EXISTS a closed gate of the run's agent."""
    gated = AgentGate.objects.filter(agent=OuterRef("agent"), paused=True)
    rule = Q(Q(status__in=sorted(CLAIMABLE)), ~Exists(gated))
    return rule if due is None else rule & Q(not_before__lte=due)


class Attempt(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_attempt_id, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    status = models.CharField(
        max_length=20, choices=AttemptStatus.choices, default=AttemptStatus.QUEUED
    )
    reason = models.CharField(max_length=20, choices=AttemptReason.choices)
    resume_from = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The answered request that this attempt continues from (resume), handed to the worker.
    resume_request = models.ForeignKey(
        "InputRequest", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    worker_id = models.CharField(max_length=200, blank=True)
    # The worker token that claimed the attempt over the worker API (None: claimed in
    # process). Every fenced write over the API must come with this token.
    worker_token = models.ForeignKey(
        "WorkerToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    lease_epoch = models.PositiveIntegerField(null=True, blank=True)
    cancel_epoch = models.PositiveIntegerField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    error_class = models.CharField(max_length=30, choices=FailureClass.choices, blank=True)
    error_type = models.CharField(max_length=200, blank=True)
    error_message = models.TextField(blank=True)
    error_step = models.CharField(max_length=100, blank=True)
    error_fingerprint = models.CharField(max_length=64, blank=True)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal("0"))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="attempt_run_number_uniq"),
            # At most one live attempt per run, enforced by the database and not only by code.
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(status__in=[AttemptStatus.QUEUED, AttemptStatus.RUNNING]),
                name="attempt_one_live_per_run",
            ),
        ]
        indexes = [
            # Serves leases_expire: WHERE status = 'running' AND lease_expires_at <= now.
            models.Index(
                fields=["lease_expires_at"],
                name="attempt_lease_expiry_idx",
                condition=Q(status=AttemptStatus.RUNNING),
            ),
            # Serves a worker's recent lease losses (runs/workers.py workers_overview):
            # WHERE status = 'lost' AND ended_at >= … ORDER BY ended_at DESC.
            models.Index(
                fields=["-ended_at"],
                name="attempt_lost_idx",
                condition=Q(status=AttemptStatus.LOST),
            ),
            # Serves the failures rollup (runs/stats.py): attempts WHERE error_class <> ''
            # AND ended_at >= the first open hour.
            models.Index(
                fields=["ended_at"],
                name="attempt_error_ended_idx",
                condition=~Q(error_class=""),
            ),
        ]
        ordering = ["run", "number"]

    def __str__(self) -> str:
        return self.id


class InputRequest(models.Model):
    """A question or an approval asked at a hold point. The question never changes once asked."""

    id = models.CharField(primary_key=True, max_length=40, default=new_request_id, editable=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="input_requests")
    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="input_requests")
    # Null only after the retention sweep purged a finished run's checkpoints.
    checkpoint = models.ForeignKey(
        Checkpoint, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    kind = models.CharField(max_length=20, choices=RequestKind.choices)
    step_id = models.CharField(max_length=100, blank=True)
    reason = models.TextField(blank=True)
    prompt = models.TextField()
    accepted_schema = models.JSONField()
    context = models.JSONField(default=dict, blank=True)
    # For auth_required: what will be done (tool, target, planned change, reversibility).
    action = models.JSONField(default=dict, blank=True)
    expires_at = models.DateTimeField()
    status = models.CharField(
        max_length=20, choices=RequestStatus.choices, default=RequestStatus.PENDING
    )
    answer = models.JSONField(null=True, blank=True)
    answered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    answered_at = models.DateTimeField(null=True, blank=True)
    # The approval policy it was asked under (runs/approvals.py, resolved when asked), and
    # the approvers' edit of the planned arguments so far (null: none; an edit resets the
    # approvals given before it, ``edit_round`` counts them).
    policy = models.JSONField(default=dict, blank=True)
    edited = models.JSONField(null=True, blank=True)
    edit_round = models.PositiveIntegerField(default=0)
    # How many decisions were recorded on it (ApprovalVote rows): part of the card's version.
    decisions = models.PositiveIntegerField(default=0)
    # Why a request closed without an answer ("run cancelled", "expired").
    closed_reason = models.CharField(max_length=200, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # Serves the inbox and requests_expire: WHERE status = 'pending' ORDER BY expires_at.
            models.Index(
                fields=["expires_at"],
                name="request_pending_expiry_idx",
                condition=Q(status=RequestStatus.PENDING),
            ),
            models.Index(fields=["status", "-answered_at"], name="request_status_answered_idx"),
            # Serves the inbox badge and tab count: SELECT COUNT(*) … WHERE status = 'pending'
            # AND kind IN (…), an index-only scan that grows with the pending requests, not
            # with every request ever asked (a sequential scan of the table without it).
            models.Index(
                fields=["kind"],
                name="request_pending_kind_idx",
                condition=Q(status=RequestStatus.PENDING),
            ),
            # Serves the operations page's expired share (runs/stats.py): WHERE status =
            # 'expired' AND closed_at >= the window's start.
            models.Index(
                fields=["closed_at"],
                name="request_expired_closed_idx",
                condition=Q(status=RequestStatus.EXPIRED),
            ),
        ]

    def __str__(self) -> str:
        return self.id


class ApprovalVoteQuerySet(models.QuerySet["ApprovalVote"]):
    def standing(self) -> ApprovalVoteQuerySet:
        """Decisions nobody has changed since: a person who changes their mind supersedes
        their earlier decision of the round (``runs/services/approvals.py``)."""
        return self.filter(superseded_at__isnull=True)


class ApprovalVote(models.Model):
    """One person's decision on an approval (``runs/services/approvals.py``): the request
    is answered once its policy is met (N distinct approvals of the same arguments, or a
    deny, or a response). An edit starts a new round: approvals of an earlier round
    approved something else and no longer count. A person who changes their mind within a
    round writes a new decision and supersedes their earlier one (``superseded_at``): the
    history stays, and only the standing decision counts."""

    request = models.ForeignKey(InputRequest, on_delete=models.CASCADE, related_name="votes")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor = models.CharField(max_length=200)
    decision = models.CharField(max_length=10)
    comment = models.TextField(blank=True)
    edited = models.JSONField(null=True, blank=True)
    round = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set when the same person decided again in the same round (a change of mind).
    superseded_at = models.DateTimeField(null=True, blank=True)
    # How the decision was made: "dashboard", "api", "email" (a link in an e-mail), or ""
    # (a command or code: the actor says who).
    via = models.CharField(max_length=20, blank=True, default="")
    # The nonce of the e-mail link it was made with (runs/action_links.py): a link decides once.
    link = models.CharField(max_length=64, blank=True, default="")

    objects = ApprovalVoteQuerySet.as_manager()

    class Meta:
        ordering = ["request", "created_at", "id"]
        constraints = [
            # A person has one standing decision per round, whatever the code above does.
            models.UniqueConstraint(
                fields=["request", "round", "user"],
                condition=Q(superseded_at__isnull=True),
                name="approvalvote_one_standing_per_person_round",
            )
        ]

    def __str__(self) -> str:
        return f"{self.request_id} {self.decision} by {self.actor}"


class AgentApprovalPolicy(models.Model):
    """An approval policy set by an operator (``manage.py agent policy``): it overrides
    the one the agent's code gives (SDK ``approval_policy=``)."""

    agent = models.CharField(max_length=100, primary_key=True)
    policy = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.agent


class Notification(models.Model):
    """One message the outbox owes about a request (docs/notifications.md): written in the
    transaction that asks the question, sent later by the sweep, outside any transaction.

    ``key`` is the idempotency key, request + recipient + kind: unique here, and sent with
    the message (``Idempotency-Key`` of a webhook, the e-mail's ``Message-ID``) so that a
    receiver that sees it twice after a crash can tell.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENDING = "sending", "Sending"
        SENT = "sent", "Sent"
        SKIPPED = "skipped", "Skipped"
        FAILED = "failed", "Failed"

    key = models.CharField(max_length=200, unique=True)
    request = models.ForeignKey(
        InputRequest, on_delete=models.CASCADE, related_name="notifications"
    )
    kind = models.CharField(max_length=20)  # pending | reminder | escalation
    channel = models.CharField(max_length=10)  # email | webhook
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    group = models.CharField(max_length=150, blank=True)
    due_at = models.DateTimeField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    # While ``sending``: the sender's lease; a sender that crashed lets it run out.
    locked_until = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    # The key of the message that carried it (its own, or the digest it was folded into).
    message_key = models.CharField(max_length=200, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # Serves the sender's claim: WHERE status IN ('pending','sending') ORDER BY due_at.
            models.Index(
                fields=["due_at"],
                name="notification_due_idx",
                condition=Q(status__in=["pending", "sending"]),
            ),
        ]

    def __str__(self) -> str:
        return self.key


class NotificationPreference(models.Model):
    """A person's channels, set on their profile page (default: all on)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="holdpoint_notifications",
    )
    email = models.BooleanField(default=True)
    browser = models.BooleanField(default=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.user_id}: email={self.email} browser={self.browser}"


class RunEvent(models.Model):
    """Append-only history of a run: the timeline, the live push and the audit trail read it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=60)
    actor = models.CharField(max_length=200)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="event_run_seq_uniq")]
        ordering = ["run", "seq"]
        permissions = [("view_audit", "Can export the audit trail")]
        indexes = [
            # Serve the audit trail (runs/audit_log.py, GET /api/audit): WHERE type IN
            # (AUDIT_EVENT_TYPES) [AND created_at BETWEEN …] ORDER BY created_at DESC, id DESC
            # LIMIT n, and its keyset cursor. Partial: decisions and control operations
            # are a small share of all events, so the index stays small and a page never
            # walks past heartbeats' neighbours (checkpoints, logs, side effects).
            models.Index(
                fields=["-created_at", "-id"],
                name="event_audit_idx",
                condition=Q(type__in=AUDIT_EVENT_TYPES),
            ),
            # The same, for one person (``?actor=``): WHERE actor IN (…) AND type IN (…).
            models.Index(
                fields=["actor", "-created_at", "-id"],
                name="event_audit_actor_idx",
                condition=Q(type__in=AUDIT_EVENT_TYPES),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"


class AgentEvent(models.Model):
    """Append-only history of what people changed about an agent that is no run's: the
    rules of the tools it calls through the MCP gateway (``ledger.services.tool_rules``).
    The audit trail (runs/audit_log.py) reads these beside the runs' events. Written by
    ``runs.events.append_agent_event``, in the transaction of the change it records."""

    agent = models.CharField(max_length=100)
    type = models.CharField(max_length=60)
    actor = models.CharField(max_length=200)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # Serve the audit trail's second source: ORDER BY created_at DESC, id DESC LIMIT
            # n with its keyset cursor, and the same for one person (``?actor=``).
            models.Index(fields=["-created_at", "-id"], name="agent_event_audit_idx"),
            models.Index(
                fields=["actor", "-created_at", "-id"], name="agent_event_audit_actor_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent} {self.type}"


class IdempotencyRecord(models.Model):
    """The first answer to an ``Idempotency-Key``, kept so that a repeat gets it again.

    Keys are scoped to the principal that sent them (``user:<pk>``, ``worker:<name>``).
    The unique constraint on (principal, key) decides who is first: the winner's
    INSERT commits before its work starts, everyone else's fails and reads the row.
    ``locked_until`` is the in-progress lease: a record still in progress after it
    belongs to a caller that crashed, and the next request with the key takes over.
    """

    class State(models.TextChoices):
        IN_PROGRESS = "in_progress", "In progress"
        COMPLETED = "completed", "Completed"

    principal = models.CharField(max_length=200)
    key = models.CharField(max_length=255)
    # sha256 of method, path and the canonical JSON body: the same key for another request is a 422.
    fingerprint = models.CharField(max_length=64)
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=2000)
    state = models.CharField(max_length=20, choices=State.choices, default=State.IN_PROGRESS)
    # Who holds the in-progress lease; only the holder may store the response.
    owner = models.CharField(max_length=32, blank=True)
    locked_until = models.DateTimeField(null=True, blank=True)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.BinaryField(null=True, blank=True)
    response_content_type = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["principal", "key"], name="idempotency_principal_key")
        ]
        indexes = [
            # Serves the purge sweep: WHERE expires_at <= now (and in-progress leases run out).
            models.Index(fields=["expires_at"], name="idempotency_expiry_idx"),
            models.Index(
                fields=["locked_until"],
                name="idempotency_in_progress_idx",
                condition=Q(state="in_progress"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.principal} {self.key}"


class WorkerToken(models.Model):
    """A credential for the worker API. Only the SHA-256 of the secret is stored.

    ``python manage.py workertoken create NAME`` prints the secret once. A revoked
    token stays for the record; a new token may then take the same name.
    """

    name = models.SlugField(max_length=100)
    # sha256 hex of the whole token; tokens carry 256 random bits, so a plain hash is enough.
    token_hash = models.CharField(max_length=64, unique=True)
    # The first characters of the token, to tell tokens apart in listings.
    prefix = models.CharField(max_length=16)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Its scope: the agents it may serve (claim, declare, report on); empty: any agent that
    # no other token owns (runs/tokens.py).
    agents = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["name"],
                condition=Q(revoked_at__isnull=True),
                name="workertoken_active_name_uniq",
            )
        ]

    def __str__(self) -> str:
        return self.name


class Worker(models.Model):
    """A worker as it last said it was (runs/workers.py): its presence, not its work.

    In process (``runagents``, ``serve``: principal ``process``) or remote (over the worker
    protocol: principal ``token:<name>`` of the worker token it calls with), one row per
    name under each principal. Contact is recorded at a bounded rate
    (``runs.services.worker_seen``): ``last_seen_at`` may lag the latest call by up to
    ``runs.workers.TOUCH_SECONDS``, which the windows below allow for. Alive until
    ``stale_at``, stale until ``gone_at`` (both from the worker's lease and claim wait),
    gone after, or at once when it said it stopped. ``state`` is the state last published
    to the live pages (the sweep ``workers_sweep`` moves it as time passes).
    """

    class Kind(models.TextChoices):
        PROCESS = "process", "In process"
        REMOTE = "remote", "Remote"

    class State(models.TextChoices):
        ALIVE = "alive", "Alive"
        STALE = "stale", "Stale"
        GONE = "gone", "Gone"

    principal = models.CharField(max_length=120)
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    client = models.CharField(max_length=100, blank=True)
    client_version = models.CharField(max_length=40, blank=True)
    host = models.CharField(max_length=200, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    agents = models.JSONField(default=list, blank=True)
    concurrency = models.PositiveIntegerField(default=1)
    lease_seconds = models.FloatField()
    wait_seconds = models.FloatField(default=0)
    # A digest of what the worker says it is: a routine contact compares it and writes one
    # UPDATE; a change (a restart: another pid) goes the slow way and is pushed.
    identity_hash = models.CharField(max_length=64)
    first_seen_at = models.DateTimeField()
    # Since when it is this process (this identity), alive without a break.
    since = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    stale_at = models.DateTimeField()
    gone_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.ALIVE)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["principal", "name"], name="worker_principal_name")
        ]
        indexes = [
            # Serves workers_sweep: WHERE state <> 'gone' AND stale_at <= now (and gone_at).
            models.Index(
                fields=["stale_at"], name="worker_present_idx", condition=~Q(state="gone")
            ),
            # Serves the Workers page and the waiting selector: newest contact first.
            models.Index(fields=["-last_seen_at"], name="worker_last_seen_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.principal})"


class SlackMessage(models.Model):
    """A Slack message about a request, posted to a group's channel (docs/notifications.md,
    Slack): where it is (``channel``, ``ts``) and which version of the request it shows
    (``shown``), so that every message is updated when the request changes, wherever it
    was decided (``ledger/slack.py`` ``slack_sync``); ``final`` once it shows the end."""

    # The notification row's key: one message per request and group, also after a crash.
    key = models.CharField(max_length=200, unique=True)
    request = models.ForeignKey(
        InputRequest, on_delete=models.CASCADE, related_name="slack_messages"
    )
    channel = models.CharField(max_length=40)
    ts = models.CharField(max_length=40)
    shown = models.CharField(max_length=100)
    final = models.BooleanField(default=False)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "ts"], name="slackmessage_channel_ts")
        ]
        indexes = [
            # Serves the sync: the messages that may still change.
            models.Index(fields=["request"], name="slackmessage_live_idx", condition=Q(final=False))
        ]

    def __str__(self) -> str:
        return f"{self.request_id} in {self.channel} at {self.ts}"


class SlackIdentity(models.Model):
    """A person's Slack account (docs/notifications.md, Slack): a click in Slack decides
    as this person, never as anyone else. Made by the person from their profile page (the
    link Slack shows them), or by a verified e-mail match when an administrator turned that
    on (``HOLDPOINT_SLACK_LINK_BY_EMAIL``)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_identity"
    )
    team_id = models.CharField(max_length=40)
    slack_user_id = models.CharField(max_length=40)
    linked_by = models.CharField(max_length=20)  # "profile" | "email"
    linked_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team_id", "slack_user_id"], name="slackidentity_team_user"
            )
        ]
        verbose_name_plural = "Slack identities"

    def __str__(self) -> str:
        return f"{self.slack_user_id}@{self.team_id}"


class OidcIdentity(models.Model):
    """The account a person signs in with at the company's identity provider
    (docs/security.md, "Company sign-in"): the provider's ``iss`` and ``sub``, which never
    change for one person there. A person is found by these two, never by e-mail alone;
    ``runs.services.accounts.oidc_sign_in`` creates the row at a first sign-in, or links an
    existing account under the linking rule. An administrator may link one by hand here.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity"
    )
    issuer = models.CharField(max_length=255)
    # OpenID Connect Core 1.0 §2: at most 255 ASCII characters.
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)
    # The groups the mapping gave at the last sign-in (for the admin and the log; the
    # memberships themselves are Django's).
    mapped_groups = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="oidc_identity_iss_sub")
        ]
        verbose_name = "OpenID Connect identity"
        verbose_name_plural = "OpenID Connect identities"

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"


# --- The operations page's rollups (runs/stats.py) -----------------------------------------


class RunHour(models.Model):
    """Runs that finished in one hour, by agent and outcome: what the operations page counts
    over a day or a week without reading a million runs (``runs.stats``). Kept by the sweep
    (``stats_rollup``), which recomputes the open hours from ``Run`` and never edits a run."""

    hour = models.DateTimeField()
    agent = models.CharField(max_length=100)
    status = models.CharField(max_length=20)
    failure_class = models.CharField(max_length=30, blank=True)
    runs = models.PositiveIntegerField()
    cost = models.DecimalField(max_digits=20, decimal_places=6, default=Decimal("0"))

    class Meta:
        indexes = [models.Index(fields=["hour"], name="runhour_hour_idx")]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.agent} {self.status}: {self.runs}"


class FailureHour(models.Model):
    """Attempts that ended with an error in one hour, by agent, class and fingerprint
    (``runs.stats``; kept by the sweep like ``RunHour``)."""

    hour = models.DateTimeField()
    agent = models.CharField(max_length=100)
    error_class = models.CharField(max_length=30)
    fingerprint = models.CharField(max_length=64, blank=True)
    error_type = models.CharField(max_length=200, blank=True)
    message = models.CharField(max_length=200, blank=True)
    attempts = models.PositiveIntegerField()

    class Meta:
        indexes = [models.Index(fields=["hour"], name="failurehour_hour_idx")]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}h {self.agent} {self.error_class}: {self.attempts}"


class StatsRollup(models.Model):
    """How far the rollups are kept (one row): the sweep that takes it ``FOR UPDATE SKIP
    LOCKED`` recomputes the hours since, so many sweepers never do the work twice."""

    name = models.CharField(max_length=40, primary_key=True)
    rolled_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} at {self.rolled_at}"
