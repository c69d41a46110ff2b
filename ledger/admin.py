"""The ledger in the admin: for looking only. Side effects change through
``ledger.services`` (reconcile and compensate from the dashboard or the API), so that
every change writes its run event under the run lock."""

from __future__ import annotations

from django.contrib import admin
from django.utils.translation import gettext_lazy as _

from ledger.models import SideEffect, ToolRule
from runs.admin import ReadOnlyAdmin


@admin.register(SideEffect)
class SideEffectAdmin(ReadOnlyAdmin):
    list_display = [
        "operation_id",
        "run",
        "step_id",
        "tool",
        "target",
        "status",
        "reversibility",
        "late",
        "approved_by",
        "created_at",
    ]
    list_filter = ["status", "reversibility", "tool", "late"]
    search_fields = ["operation_id", "run__id", "idempotency_key", "external_reference", "target"]
    date_hierarchy = "created_at"

    @admin.display(description=_("Approved by"))
    def approved_by(self, effect: SideEffect) -> str:
        """Who approved the step the effect was done in, when, and what they said."""
        approval = effect.approval if isinstance(effect.approval, dict) else None
        if not approval:
            return "—"
        who = approval.get("by") or "—"
        comment = approval.get("comment") or ""
        at = approval.get("at") or ""
        return f"{who} · {at}" + (f" — “{comment}”" if comment else "")


@admin.register(ToolRule)
class ToolRuleAdmin(ReadOnlyAdmin):
    """The MCP gateway's tool rules; confirm them on the agent's page or with the API, so
    that each change is an audit-trail row (ledger.services.tool_rules)."""

    list_display = ["agent", "server", "tool", "suggested", "rule", "confirmed_actor", "offered"]
    list_filter = ["rule", "suggested", "offered"]
    search_fields = ["agent", "server", "tool"]
