"""The notification outbox, written in the transaction that asks a question.

When a request becomes pending, the people who may answer it are owed a message
(``pending``), and later a ``reminder`` (when ``HOLDPOINT_NOTIFY_REMIND_SHARE`` of its time
is left) and, for an approval whose policy says so, an ``escalation`` to another group.
Each is a ``Notification`` row with its idempotency key (request + recipient + kind),
committed with the request or not at all; the sender (``ledger/notifications.py``) sends
them later, outside any transaction, and sends nothing for a request that was decided,
expired or cancelled meanwhile.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db.models import Q

from runs.approvals import eligible_approvers, policy_of
from runs.models import InputRequest, Notification, NotificationPreference
from runs.states import RequestKind

MAX_RECIPIENTS = 50


def _holders(codename: str, groups: list[str] | None = None) -> list[Any]:
    """Active people holding ``runs.<codename>`` (through a group, directly, or as
    superusers); with ``groups``, the active members of those groups instead (an
    escalation group is told whoever is in it)."""
    perm = Permission.objects.filter(codename=codename, content_type__app_label="runs").first()
    holds = Q(is_superuser=True)
    if perm is not None:
        holds |= Q(groups__permissions=perm) | Q(user_permissions=perm)
    users = get_user_model().objects.filter(is_active=True).filter(holds)
    if groups is not None:
        users = get_user_model().objects.filter(is_active=True, groups__name__in=groups)
    return list(users.distinct().order_by("username")[:MAX_RECIPIENTS])


def _emailable(users: list[Any]) -> list[Any]:
    """Those with an address who have not switched e-mail off on their profile."""
    off = set(
        NotificationPreference.objects.filter(user__in=users, email=False).values_list(
            "user_id", flat=True
        )
    )
    return [u for u in users if u.email and u.pk not in off]


def _webhook_groups(groups: list[str], codename: str) -> list[str]:
    """The groups with a webhook (``HOLDPOINT_NOTIFY_WEBHOOKS``) that this request concerns:
    the policy's groups, else every configured group holding the permission."""
    configured = settings.HOLDPOINT_NOTIFY_WEBHOOKS
    if groups:
        return [g for g in groups if g in configured]
    from django.contrib.auth.models import Group

    return list(
        Group.objects.filter(
            name__in=list(configured),
            permissions__codename=codename,
            permissions__content_type__app_label="runs",
        )
        .values_list("name", flat=True)
        .distinct()
        .order_by("name")
    )


def notification_key(request_id: str, recipient: str, kind: str) -> str:
    return f"{request_id}:{recipient}:{kind}"


def outbox_for_request(request: InputRequest, now: dt.datetime) -> int:
    """Write the messages owed about ``request`` (just created, in its transaction);
    return how many."""
    if request.kind == RequestKind.PAUSE:
        return 0
    is_approval = request.kind == RequestKind.AUTH_REQUIRED
    policy = policy_of(request.policy) if is_approval else {}
    codename = "approve_run" if is_approval else "answer_run"
    people = (
        eligible_approvers(request, limit=MAX_RECIPIENTS) if is_approval else _holders(codename)
    )
    groups = _webhook_groups(list(policy.get("groups") or []), codename)
    # The policy's own share of the time left, else the deployment's.
    share = float(policy.get("remind") or settings.HOLDPOINT_NOTIFY_REMIND_SHARE)
    times: list[tuple[str, dt.datetime]] = [("pending", now)]
    if share > 0:
        remind_at = request.expires_at - (request.expires_at - now) * share
        if remind_at > now:
            times.append(("reminder", remind_at))
    rows: list[Notification] = []

    def owe(
        kind: str, due: dt.datetime, users: list[Any], webhooks: list[str], label: str = ""
    ) -> None:
        for user in _emailable(users):
            rows.append(
                Notification(
                    key=notification_key(request.id, f"user:{user.pk}", kind),
                    request=request,
                    kind=kind,
                    channel="email",
                    user=user,
                    group=label,
                    due_at=due,
                )
            )
        for group in webhooks:
            rows.append(
                Notification(
                    key=notification_key(request.id, f"group:{group}", kind),
                    request=request,
                    kind=kind,
                    channel="webhook",
                    group=group,
                    due_at=due,
                )
            )

    for kind, due in times:
        owe(kind, due, people, groups)
    escalation = policy.get("escalation") if is_approval else None
    if isinstance(escalation, dict):
        due = now + dt.timedelta(minutes=int(escalation["after_minutes"]))
        group = str(escalation["group"])
        if due < request.expires_at:
            members = _holders(codename, [group])
            hooks = [group] if group in settings.HOLDPOINT_NOTIFY_WEBHOOKS else []
            owe("escalation", due, members, hooks, label=group)
    Notification.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def notification_preferences_set(*, user: Any, email: bool, browser: bool) -> None:
    """A person's channels (their profile page): off means nothing more on that channel;
    messages already owed on it are not written again but stay as they are."""
    NotificationPreference.objects.update_or_create(
        user=user, defaults={"email": bool(email), "browser": bool(browser)}
    )


def notification_preferences(user: Any) -> NotificationPreference:
    """A person's channels (all on until they say otherwise); not saved."""
    found = NotificationPreference.objects.filter(user=user).first()
    return found if found is not None else NotificationPreference(user=user)
