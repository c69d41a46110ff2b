"""Links that let a person decide an approval from the e-mail that told them about it.

A notification e-mail about an approval carries an **Approve** and a **Deny** link
(``ledger/notifications.py`` writes them, ``dashboard/views/act.py`` serves them). Each
link is a token signed with ``SECRET_KEY`` (Django's ``signing``, its own salt) that
names the request, the person it was sent to, the decision, the request's version
(``edit_round``: an edit makes every older link refuse) and the link's ``nonce``. The
nonce is the same for both links of one message about one request: the links of an
e-mail decide once, together.

What the token does not carry is checked when it is used, under the run's lock
(``runs/services/approvals.py``): the request still pending and not expired, the version
still the same, no decision made with this nonce yet (``ApprovalVote.link``), and the
person's right under the approval's policy, as for every other decision. Opening a link
never decides anything: it shows a page, and only that page's POST, from the signed-in
person the link was sent to, decides (docs/security.md, "Links in e-mails").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.core import signing

from runs.models import ApprovalVote

SALT = "holdpoint.action-link.v1"
DECISIONS = ("approve", "deny")
# A token is about 150 characters; anything much longer is not one of ours.
MAX_TOKEN_LENGTH = 400


@dataclass(frozen=True)
class ActionLink:
    """What a signed link says: decide ``request_id`` as ``decision``, for ``user_id``,
    on version ``edit_round`` of the request, once per ``nonce``."""

    request_id: str
    user_id: int
    decision: str
    edit_round: int
    nonce: str


def link_nonce(message_key: str, request_id: str) -> str:
    """The nonce of the links about ``request_id`` in the message ``message_key`` (the
    notification row's key, or a digest's): the same message gives the same links again
    when it is sent again, and another message (a reminder) gives new ones."""
    return hashlib.sha256(f"{message_key}|{request_id}".encode()).hexdigest()[:32]


def sign_link(link: ActionLink) -> str:
    return signing.dumps(
        {
            "r": link.request_id,
            "u": link.user_id,
            "d": link.decision,
            "v": link.edit_round,
            "n": link.nonce,
        },
        salt=SALT,
        compress=True,
    )


def read_link(token: str) -> ActionLink | None:
    """The link a token signs, or None for anything that is not an intact token of ours."""
    if not token or len(token) > MAX_TOKEN_LENGTH:
        return None
    try:
        data: Any = signing.loads(token, salt=SALT)
    except signing.BadSignature:
        return None
    try:
        link = ActionLink(
            request_id=str(data["r"]),
            user_id=int(data["u"]),
            decision=str(data["d"]),
            edit_round=int(data["v"]),
            nonce=str(data["n"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
    return link if link.decision in DECISIONS else None


@dataclass(frozen=True)
class LinkUse:
    """A decision made with a link's nonce: what, by whom, when."""

    decision: str
    who: str
    at: Any


def link_used(request_id: str, nonce: str) -> LinkUse | None:
    """The decision made with this nonce, if one was (superseded or not: a link decides once)."""
    vote = (
        ApprovalVote.objects.filter(request_id=request_id, link=nonce)
        .select_related("user")
        .order_by("created_at", "id")
        .first()
    )
    if vote is None:
        return None
    who = vote.user.get_username() if vote.user is not None else vote.actor
    return LinkUse(decision=vote.decision, who=who, at=vote.created_at)
