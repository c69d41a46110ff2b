"""The default groups and the permissions each holds (created by migration 0002). A bare
codename is the run store's (``runs``); ``app.codename`` names another app's."""

from __future__ import annotations

from typing import Any

GROUPS: dict[str, list[str]] = {
    "viewer": ["view_run"],
    "operator": [
        "view_run",
        "answer_run",
        "start_run",
        "cancel_run",
        "retry_run",
        "pause_agent",
        "view_worker",
    ],
    "approver": ["view_run", "answer_run", "approve_run"],
    "admin": [
        "view_run",
        "answer_run",
        "approve_run",
        "start_run",
        "cancel_run",
        "retry_run",
        "pause_agent",
        "view_worker",
        "view_audit",
        # Confirm the rules of the tools an agent calls through the MCP gateway.
        "ledger.change_toolrule",
    ],
}


def ensure_default_groups(group_model: Any = None, permission_model: Any = None) -> None:
    """Create the groups (idempotent). Migrations pass their historical models."""
    if group_model is None or permission_model is None:
        from django.contrib.auth.models import Group, Permission

        group_model, permission_model = Group, Permission
    for name, codenames in GROUPS.items():
        group, _ = group_model.objects.get_or_create(name=name)
        by_app: dict[str, list[str]] = {}
        for name_ in codenames:
            app, _dot, codename = name_.rpartition(".")
            by_app.setdefault(app or "runs", []).append(codename)
        for app, names in by_app.items():
            perms = permission_model.objects.filter(content_type__app_label=app, codename__in=names)
            group.permissions.add(*perms)
