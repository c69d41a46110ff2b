"""The side-effect ledger: what a run did to the world outside the database.

A ``SideEffect`` row is written ``pending`` and committed *before* the action runs,
so that a crash between acting and recording leaves a trace that the next attempt
(or a person) finds by idempotency key. Only ``ledger.services`` writes these rows,
always under the lock of the run they belong to (the run row is the one lock for
everything of a run, see ``runs.models``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from runs.ids import new_id


def new_operation_id() -> str:
    return new_id("op")


class SideEffectStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    CONFIRMED = "confirmed", _("Happened")
    FAILED = "failed", _("Did not happen")
    UNKNOWN = "unknown", _("Unknown")
    COMPENSATED = "compensated", _("Compensated")
    COMPENSATION_FAILED = "compensation_failed", _("Compensation failed")


class Reversibility(models.TextChoices):
    REVERSIBLE = "reversible", _("Reversible")
    COMPENSABLE = "compensable", _("Compensable")
    IRREVERSIBLE = "irreversible", _("Cannot be undone")


class Resolution(models.TextChoices):
    """How a person or the reconciler settled an ``unknown`` or stale ``pending`` effect."""

    CONFIRMED = "confirmed", _("Happened")
    NOT_APPLIED = "not_applied", _("Did not happen")


# Statuses that say nothing final about the world yet.
UNSETTLED = frozenset({SideEffectStatus.PENDING, SideEffectStatus.UNKNOWN})


class SideEffect(models.Model):
    operation_id = models.CharField(
        primary_key=True, max_length=40, default=new_operation_id, editable=False
    )
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="side_effects")
    # The attempt that wrote the intent (and, normally, acted).
    attempt = models.ForeignKey(
        "runs.Attempt", on_delete=models.PROTECT, related_name="side_effects"
    )
    step_id = models.CharField(max_length=100)
    tool = models.CharField(max_length=100)
    # 0 for the first performance of (run, step, tool); a compensated effect that the
    # run performs again is a new row with the next generation and a new key.
    generation = models.PositiveIntegerField(default=0)
    # Generated before the act, deterministic from run, step, tool (and generation), so
    # a retry of the same step sends the external system the same key.
    idempotency_key = models.CharField(max_length=255, unique=True)
    target = models.CharField(max_length=500)
    request = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=20, choices=SideEffectStatus.choices, default=SideEffectStatus.PENDING
    )
    reversibility = models.CharField(max_length=20, choices=Reversibility.choices)
    # What would undo the effect (given by the agent, or planned by the tool).
    compensating_action = models.JSONField(null=True, blank=True)
    external_reference = models.CharField(max_length=500, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # The outcome was reported by a worker that no longer held the run (stale lease,
    # cancelled run): recorded anyway, because it is a fact about the world.
    late = models.BooleanField(default=False)
    # Who said the irreversible action may go ahead: {source, request_id, by, comment, at}.
    approval = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    outcome_at = models.DateTimeField(null=True, blank=True)
    outcome_actor = models.CharField(max_length=200, blank=True)
    # When the reconciler last asked the tool about this key (rate-limits the sweep).
    looked_up_at = models.DateTimeField(null=True, blank=True)

    resolution = models.CharField(max_length=20, choices=Resolution.choices, blank=True)
    resolution_note = models.TextField(blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resolved_actor = models.CharField(max_length=200, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    compensation_idempotency_key = models.CharField(max_length=255, blank=True)
    # Started and not ended: a compensation is under way (or crashed while under way).
    compensation_started_at = models.DateTimeField(null=True, blank=True)
    compensation_ended_at = models.DateTimeField(null=True, blank=True)
    compensation_reference = models.CharField(max_length=500, blank=True)
    compensation_result = models.JSONField(null=True, blank=True)
    compensation_error = models.JSONField(null=True, blank=True)
    compensated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    compensation_actor = models.CharField(max_length=200, blank=True)
    # Why a person undid the effect (the dashboard and the API ask for it).
    compensation_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["run", "created_at", "operation_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["compensation_idempotency_key"],
                condition=~Q(compensation_idempotency_key=""),
                name="side_effect_compensation_key_uniq",
            ),
        ]
        indexes = [
            # Serves side_effects_for_run and the run report: WHERE run_id = … ORDER BY created_at.
            models.Index(fields=["run", "created_at"], name="side_effect_run_created_idx"),
            # Serves side_effects_needing_reconciliation, the retry guard and the reconciler
            # sweep: WHERE status IN ('pending','unknown') ORDER BY created_at. Partial, so it
            # holds only the few unsettled rows.
            models.Index(
                fields=["created_at"],
                name="side_effect_unsettled_idx",
                condition=Q(status__in=[SideEffectStatus.PENDING, SideEffectStatus.UNKNOWN]),
            ),
            models.Index(fields=["status", "-created_at"], name="side_effect_status_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id} {self.tool} {self.target} ({self.status})"

    @property
    def is_settled(self) -> bool:
        return self.status not in UNSETTLED

    @property
    def compensation_in_progress(self) -> bool:
        return self.compensation_started_at is not None and self.compensation_ended_at is None


class ToolRuleKind(models.TextChoices):
    """What the MCP gateway does with a call of a tool (docs/api.md, "Tool rules")."""

    PASS = "pass", _("Pass: a read, not recorded")
    RECORD = "record", _("Record: a side effect in the ledger, no approval")
    APPROVE = "approve", _("Approve: asks for approval under the agent's policy")


class ToolRule(models.Model):
    """The rule of one tool an agent calls through the MCP gateway: (agent, server, tool).

    The gateway reports each tool it proxies (``ledger.services.tool_rules_report``); its
    MCP annotations only *suggest* a rule. Until a person confirms one (``rule`` set),
    the rule in force is ``approve``, whatever the suggestion: the annotations come from
    the downstream server, which the gateway does not trust."""

    agent = models.CharField(max_length=100)
    server = models.CharField(max_length=64)
    tool = models.CharField(max_length=128)
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict, blank=True)
    # The MCP annotations as reported, known keys only (readOnlyHint, destructiveHint, …).
    annotations = models.JSONField(default=dict, blank=True)
    suggested = models.CharField(max_length=10, choices=ToolRuleKind.choices)
    # None until a person confirms: the rule in force is then ``approve``. NULL, not "", so
    # that "nobody confirmed" can never be read as a rule.
    rule = models.CharField(  # noqa: DJ001
        max_length=10, choices=ToolRuleKind.choices, null=True, blank=True
    )
    # [{"argument", "matches", "rule"}], in order; the first that matches wins (the gateway).
    patterns = models.JSONField(default=list, blank=True)
    confirmed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    confirmed_actor = models.CharField(max_length=200, blank=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    # The hash of the description, schema and annotations the person saw when confirming
    # (``ledger.services.tool_rules.tool_hash``); a later report that differs shows
    # "changed since confirmed" and keeps the person's rule.
    confirmed_hash = models.CharField(max_length=64, blank=True)
    # The hash of what the gateway reported last.
    reported_hash = models.CharField(max_length=64, blank=True)
    # In the gateway's last report: a tool it no longer offers is kept (with its rule) for
    # a later session that offers it again.
    offered = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["agent", "server", "tool"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "server", "tool"], name="toolrule_unique"),
            models.CheckConstraint(
                condition=Q(rule__isnull=True) | Q(confirmed_at__isnull=False),
                name="toolrule_confirmed_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent}: {self.server}/{self.tool}"

    @property
    def confirmed(self) -> bool:
        return self.rule is not None

    @property
    def in_force(self) -> str:
        """The rule the gateway applies: the confirmed one, else ``approve``."""
        return self.rule or ToolRuleKind.APPROVE

    @property
    def changed_since_confirmed(self) -> bool:
        return self.confirmed and self.confirmed_hash != self.reported_hash
