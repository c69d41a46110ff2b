"""The admin shows every model; history (attempts, checkpoints, requests, events) is read-only.

Run state changes only through ``runs.services``, so runs are read-only here too:
the admin is for looking, the dashboard and the API are for acting.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from runs.models import (
    AgentEvent,
    AgentGate,
    Attempt,
    Checkpoint,
    DeclaredAgent,
    IdempotencyRecord,
    InputRequest,
    OidcIdentity,
    Run,
    RunEvent,
    WorkerToken,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = [
        "number",
        "status",
        "reason",
        "worker_id",
        "lease_epoch",
        "error_class",
        "error_message",
    ]
    readonly_fields = (
        "number",
        "status",
        "reason",
        "worker_id",
        "lease_epoch",
        "error_class",
        "error_message",
    )
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "agent",
        "status",
        "failure_class",
        "cancel_epoch",
        "lease_epoch",
        "created_at",
    ]
    list_filter = ["status", "agent", "failure_class"]
    search_fields = ["id", "agent"]
    inlines = [AttemptInline]


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "run",
        "number",
        "status",
        "reason",
        "worker_id",
        "lease_epoch",
        "error_class",
    ]
    list_filter = ["status", "reason", "error_class"]
    search_fields = ["id", "run__id", "worker_id"]


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "number", "step", "created_at"]
    search_fields = ["id", "run__id", "step"]


@admin.register(InputRequest)
class InputRequestAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "kind", "status", "expires_at", "answered_by", "answered_at"]
    list_filter = ["kind", "status"]
    search_fields = ["id", "run__id", "prompt"]


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ["run", "seq", "type", "actor", "created_at"]
    list_filter = ["type"]
    search_fields = ["run__id", "type", "actor"]


@admin.register(AgentEvent)
class AgentEventAdmin(ReadOnlyAdmin):
    """People's changes to an agent as a whole (its MCP gateway's tool rules)."""

    list_display = ["agent", "type", "actor", "created_at"]
    list_filter = ["type"]
    search_fields = ["agent", "actor"]


@admin.register(DeclaredAgent)
class DeclaredAgentAdmin(admin.ModelAdmin):
    """Agents served by HTTP workers are declared here (or with ``manage.py agent declare``)."""

    list_display = ["name", "description", "owners", "declared_by", "created_at"]
    search_fields = ["name"]


@admin.register(AgentGate)
class AgentGateAdmin(ReadOnlyAdmin):
    """The agents' pause gates; change them with the Agents page, the API or
    ``manage.py agent pause|unpause`` (the services tell the running workers)."""

    list_display = ["agent", "paused", "actor", "reason", "paused_at", "unpaused_at"]
    list_filter = ["paused"]


@admin.register(WorkerToken)
class WorkerTokenAdmin(ReadOnlyAdmin):
    """Tokens are created with ``manage.py workertoken create`` (the secret is shown once)."""

    list_display = ["name", "prefix", "scope", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "prefix"]
    exclude = ["token_hash"]

    @admin.display(description="may serve")
    def scope(self, token: WorkerToken) -> str:
        return ", ".join(token.agents) if token.agents else "any agent no other token owns"

    actions = ["revoke"]

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("runs.change_workertoken")

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        from django.utils import timezone

        from runs.tokens import tokens_changed

        queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        tokens_changed()


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(ReadOnlyAdmin):
    list_display = ["principal", "key", "method", "path", "state", "response_status", "expires_at"]
    list_filter = ["state", "method"]
    search_fields = ["principal", "key", "path"]
    exclude = ["response_body"]


@admin.register(OidcIdentity)
class OidcIdentityAdmin(admin.ModelAdmin):
    """Who signs in as whom through the company's identity provider. An administrator links
    an existing account here (the issuer and the person's ``sub`` there); the groups the
    mapping manages are set at that person's next sign-in (docs/security.md)."""

    list_display = ("user", "subject", "issuer", "last_sign_in_at")
    search_fields = ("user__username", "user__email", "subject")
    readonly_fields = ("created_at", "last_sign_in_at", "mapped_groups")
    raw_id_fields = ("user",)
