"""The notification outbox, written in the transaction that asks a question.

When a request becomes pending, the people who may answer it are owed a message
(``pending``), and later a ``reminder`` (when ``HOLDPOINT_NOTIFY_REMIND_SHARE`` of its time
is left) and, for an approval whose policy says so, an ``escalation`` to another group.
Each is a ``Notification`` row with its idempotency key (request + recipient + kind),
committed with the request or not at all; the sender (``ledger/notifications.py``) sends
them later, outside any transaction, and sends nothing for a request that was decided,
expired or cancelled meanwhile.

**Who is told** is the run store's rule, never one of our own: only people who may see
runs (``runs.selectors``: holding ``runs.view_run``), and, for a pending notice and a
reminder, only those who may decide (``person_may``: the kind's permission and, for an
approval, its policy, ``runs.approvals.why_not_decide``). An escalation goes to the
members of its group who may see runs; those who may not decide are told they can only
look. The sender asks ``person_may`` / ``group_may`` again when it sends: a person who
lost sight of runs, or may no longer decide, since the request was asked is not told.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import Any, Literal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import QuerySet

from runs.approvals import eligible_approvers, policy_of, standing_votes, why_not_decide
from runs.models import InputRequest, Notification, NotificationPreference
from runs.selectors import VIEW, permission_for_request_kind
from runs.states import RequestKind

MAX_RECIPIENTS = 50

# What a recipient may do about a request: decide it (answer the question, or decide the
# approval under its policy), or only look at it.
Part = Literal["decide", "look"]
DECIDE: Part = "decide"
LOOK: Part = "look"


def _may_see() -> QuerySet[Any]:
    """Everyone who may see runs: ``has_perm(runs.view_run)`` (the selectors' rule), as
    Django's auth backend answers it for many people in one query (``with_perm``)."""
    return get_user_model().objects.with_perm(VIEW, is_active=True, include_superusers=True)


def _holders(perm: str) -> list[Any]:
    """Active people who may see runs and hold ``perm`` (through a group, directly, or as
    superusers)."""
    users = (
        get_user_model()
        .objects.with_perm(perm, is_active=True, include_superusers=True)
        .filter(pk__in=_may_see().values("pk"))
    )
    return list(users.order_by("username")[:MAX_RECIPIENTS])


def _seeing(users: list[Any]) -> list[Any]:
    """``users`` without those who may not see runs."""
    allowed = set(_may_see().filter(pk__in=[u.pk for u in users]).values_list("pk", flat=True))
    return [u for u in users if u.pk in allowed]


def _members(group: str) -> list[Any]:
    """The members of ``group`` who may see runs."""
    return list(_may_see().filter(groups__name=group).order_by("username")[:MAX_RECIPIENTS])


def person_may(request: InputRequest, user: Any) -> Part | None:
    """What ``user`` may do about ``request`` now: ``DECIDE``, ``LOOK`` (see the run, not
    decide it), or None: they may not see runs, and are told nothing about it."""
    if user is None or not user.is_active or not user.has_perm(VIEW):
        return None
    if not user.has_perm(permission_for_request_kind(request.kind)):
        return LOOK
    if request.kind == RequestKind.AUTH_REQUIRED and why_not_decide(request, user) is not None:
        return LOOK
    return DECIDE


def _group_permissions(names: list[str]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for name, app, codename in Group.objects.filter(name__in=names).values_list(
        "name", "permissions__content_type__app_label", "permissions__codename"
    ):
        if codename:
            found[name].add(f"{app}.{codename}")
    return found


def _group_part(request: InputRequest, group: str, perms: set[str]) -> Part | None:
    # A group's webhook reaches its whole channel: the group itself must let its members
    # see runs, or run data would reach people who may not see it.
    if VIEW not in perms:
        return None
    if permission_for_request_kind(request.kind) not in perms:
        return LOOK
    groups = (
        policy_of(request.policy)["groups"] if request.kind == RequestKind.AUTH_REQUIRED else []
    )
    if groups and group not in groups:
        return LOOK
    return DECIDE


def group_may(request: InputRequest, group: str) -> Part | None:
    """What the members of ``group`` may do about ``request``, as the group's permissions
    and the request's policy say (``person_may`` for a group's channel): None when the
    group does not let its members see runs."""
    return _group_part(request, group, _group_permissions([group]).get(group, set()))


def _emailable(users: list[Any]) -> list[Any]:
    """Those with an address who have not switched e-mail off on their profile."""
    off = set(
        NotificationPreference.objects.filter(user__in=users, email=False).values_list(
            "user_id", flat=True
        )
    )
    return [u for u in users if u.email and u.pk not in off]


def _webhook_groups(
    request: InputRequest, groups: list[str], configured: list[str] | None = None
) -> list[str]:
    """The groups with a webhook (``HOLDPOINT_NOTIFY_WEBHOOKS``; or with a Slack channel,
    ``configured``) that may decide this request: among the policy's groups, else among
    every configured group."""
    if configured is None:
        configured = list(settings.HOLDPOINT_NOTIFY_WEBHOOKS)
    candidates = [g for g in groups if g in configured] if groups else sorted(configured)
    perms = _group_permissions(candidates)
    return [g for g in candidates if _group_part(request, g, perms.get(g, set())) == DECIDE]


def notification_key(request_id: str, recipient: str, kind: str) -> str:
    return f"{request_id}:{recipient}:{kind}"


def outbox_for_request(request: InputRequest, now: dt.datetime) -> int:
    """Write the messages owed about ``request`` (just created, in its transaction);
    return how many."""
    if request.kind == RequestKind.PAUSE:
        return 0
    is_approval = request.kind == RequestKind.AUTH_REQUIRED
    policy = policy_of(request.policy) if is_approval else {}
    people = (
        _seeing(eligible_approvers(request, limit=MAX_RECIPIENTS))
        if is_approval
        else _holders(permission_for_request_kind(request.kind))
    )
    groups = _webhook_groups(request, list(policy.get("groups") or []))
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
    # Slack: one message per group channel, posted once and then kept up to date
    # (ledger/slack.py), so no reminder is posted there.
    for group in _webhook_groups(
        request, list(policy.get("groups") or []), list(settings.HOLDPOINT_SLACK_CHANNELS)
    ):
        rows.append(
            Notification(
                key=notification_key(request.id, f"slack:{group}", "pending"),
                request=request,
                kind="pending",
                channel="slack",
                group=group,
                due_at=now,
            )
        )
    escalation = policy.get("escalation") if is_approval else None
    if isinstance(escalation, dict):
        due = now + dt.timedelta(minutes=int(escalation["after_minutes"]))
        group = str(escalation["group"])
        if due < request.expires_at:
            # Those of the group who may see runs: whoever may not decide is told so.
            hooks = (
                [group]
                if group in settings.HOLDPOINT_NOTIFY_WEBHOOKS
                and group_may(request, group) is not None
                else []
            )
            owe("escalation", due, _members(group), hooks, label=group)
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


# --- An approval that was not applied (issue 24) ---------------------------------------------

# The error type of an attempt that ended without using the approval it was resumed with
# (``runtime/types.py`` ``ApprovalNotApplied``; the Python and TypeScript clients send the
# same name), and the outbox kind that tells its approvers.
APPROVAL_NOT_APPLIED = "ApprovalNotApplied"
NOT_APPLIED = "not_applied"


def outbox_not_applied(request: InputRequest, now: dt.datetime) -> int:
    """Tell the people whose approval of ``request`` was not applied (the attempt resumed
    with it failed ``ApprovalNotApplied``), in that failing transaction; return how many
    messages are owed. Once per person (key: request + person + ``not_applied``)."""
    if request.kind != RequestKind.AUTH_REQUIRED:
        return 0
    votes = (
        standing_votes(request)
        .filter(decision="approve", user__is_active=True)
        .select_related("user")
    )
    people = {vote.user.pk: vote.user for vote in votes if vote.user is not None}
    if not people and request.answered_by is not None and request.answered_by.is_active:
        people = {request.answered_by.pk: request.answered_by}
    rows = [
        Notification(
            key=notification_key(request.id, f"user:{user.pk}", NOT_APPLIED),
            request=request,
            kind=NOT_APPLIED,
            channel="email",
            user=user,
            due_at=now,
        )
        for user in _emailable(list(people.values()))
    ]
    Notification.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)
