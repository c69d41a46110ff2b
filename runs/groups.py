"""The default groups and the run permissions each holds (created by migration 0002)."""

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
    ],
}


def ensure_default_groups(group_model: Any = None, permission_model: Any = None) -> None:
    """Create the groups (idempotent). Migrations pass their historical models."""
    if group_model is None or permission_model is None:
        from django.contrib.auth.models import Group, Permission

        group_model, permission_model = Group, Permission
    for name, codenames in GROUPS.items():
        group, _ = group_model.objects.get_or_create(name=name)
        perms = permission_model.objects.filter(
            content_type__app_label="runs", codename__in=codenames
        )
        group.permissions.add(*perms)
