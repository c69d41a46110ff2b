"""Who a Slack user is here (docs/notifications.md, Slack): a click in Slack decides as the
linked person, never as anyone else.

A link is made by the person: Slack shows an unlinked clicker a link to Holdpoint that
names their Slack account (signed, valid ``LINK_MAX_AGE`` seconds); signed in, the person
confirms on that page. Or, when an administrator turned on
``HOLDPOINT_SLACK_LINK_BY_EMAIL``, by the Slack account's confirmed e-mail address when it
is the address of exactly one active person.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.core import signing
from django.db import IntegrityError, transaction

from runs.errors import HoldpointError
from runs.models import SlackIdentity

SALT = "holdpoint.slack-link.v1"
LINK_MAX_AGE = 15 * 60
MAX_ID = 40


@dataclass(frozen=True)
class SlackAccount:
    team_id: str
    user_id: str


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID and value.isalnum()


def slack_person(account: SlackAccount) -> Any:
    """The active person linked to ``account``, or None."""
    found = (
        SlackIdentity.objects.filter(team_id=account.team_id, slack_user_id=account.user_id)
        .select_related("user")
        .first()
    )
    if found is None or not found.user.is_active:
        return None
    return found.user


def link_token(account: SlackAccount) -> str:
    return signing.dumps({"t": account.team_id, "u": account.user_id}, salt=SALT)


def read_link_token(token: str) -> SlackAccount | None:
    """The Slack account a link names, while it is fresh; None for anything else."""
    if not token or len(token) > 300:
        return None
    try:
        data = signing.loads(token, salt=SALT, max_age=LINK_MAX_AGE)
    except signing.BadSignature:  # SignatureExpired is one
        return None
    if not isinstance(data, dict) or not (_valid_id(data.get("t")) and _valid_id(data.get("u"))):
        return None
    return SlackAccount(team_id=data["t"], user_id=data["u"])


@transaction.atomic
def slack_link(*, user: Any, account: SlackAccount, how: str) -> SlackIdentity:
    """Link ``account`` to ``user`` (replacing the person's earlier link). A Slack account
    linked to someone else is refused: they unlink it first (nobody takes over another
    person's clicks)."""
    other = (
        SlackIdentity.objects.select_for_update()
        .filter(team_id=account.team_id, slack_user_id=account.user_id)
        .exclude(user=user)
        .first()
    )
    if other is not None:
        raise HoldpointError(
            "invalid_state",
            "This Slack account is linked to another person; they must unlink it first.",
        )
    SlackIdentity.objects.filter(user=user).delete()
    try:
        with transaction.atomic():
            return SlackIdentity.objects.create(
                user=user,
                team_id=account.team_id,
                slack_user_id=account.user_id,
                linked_by=how,
            )
    except IntegrityError:  # linked to someone else at the same moment
        raise HoldpointError(
            "invalid_state",
            "This Slack account is linked to another person; they must unlink it first.",
        ) from None


def slack_unlink(*, user: Any) -> bool:
    deleted, _ = SlackIdentity.objects.filter(user=user).delete()
    return bool(deleted)


def person_by_email(email: Any) -> Any:
    """The one active person with ``email`` (a Slack account's confirmed address), or None
    when nobody or more than one person has it."""
    if not isinstance(email, str) or "@" not in email or len(email) > 254:
        return None
    people = list(get_user_model().objects.filter(email__iexact=email.strip(), is_active=True)[:2])
    return people[0] if len(people) == 1 else None
