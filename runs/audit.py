"""How a decision or a control operation was made: the door and the credential.

Every service that records a person's decision or a control operation (start, resume,
answer, approve, cancel, retry, pause, continue, an agent's pause and unpause) takes
``via`` and ``identity`` keyword arguments, both "" by default, and puts them in the
payloads of the events it writes through ``how``: the one place that says what the two
members are. ``via`` is the door:

- ``dashboard``: a form of the web pages (identity ``session:oidc`` or
  ``session:password``: how the session was signed in, ``session_identity``);
- ``api``: the control API (the session's identity as above, or ``token:<fingerprint>`` for
  a DRF token, ``api.base.api_identity``);
- ``email``: a signed link in a notification e-mail (identity ``email-link``; the link's
  nonce is on the vote, ``ApprovalVote.link``);
- ``slack``: a Slack message's buttons or modals (identity ``slack:<team>/<user>``, the
  Slack account linked to the person; ``api/slack.py``);
- ``cli``: a ``manage.py`` command (identity ``shell:<operating-system user>``).

System actions (an expiry, the sweep, a worker) pass neither, and their events carry
neither member. Events written before these members existed have none either.

The event types of the audit trail (``GET /api/audit``) are listed here too, because the
partial indexes that serve it (``runs.models.RunEvent``) are built from the same list.
This module imports nothing of ours: ``runs.models`` imports it.
"""

from __future__ import annotations

import getpass

DASHBOARD = "dashboard"
API = "api"
EMAIL = "email"
SLACK = "slack"
CLI = "cli"
VIAS = frozenset({DASHBOARD, API, EMAIL, SLACK, CLI})

# The identities of the doors that have one credential.
SESSION = "session"
EMAIL_LINK = "email-link"

IDENTITY_MAX_LENGTH = 200

# Decisions and control operations, by the event that records each (runs/events.py).
# Changing this list changes the partial indexes' condition: make a migration.
AUDIT_EVENT_TYPES: tuple[str, ...] = (
    "run.created",
    "run.approved_at_start",
    "request.answered",
    "approval.given",
    "approval.objected",
    "approval.changed",
    "run.continued",
    "run.cancel_requested",
    "run.retried",
    "run.pause_requested",
    "agent.paused",
    "agent.unpaused",
)


def how(*, via: str = "", identity: str = "") -> dict[str, str]:
    """The payload members that say how a decision was made: ``via`` and ``identity``,
    each only when given. An unknown ``via`` is a programming error (``ValueError``);
    an identity longer than 200 characters is cut there (an identity provider's subject
    can be long, and a decision must not fail for it)."""
    if via and via not in VIAS:
        raise ValueError(f"unknown door {via!r}; one of {sorted(VIAS)}")
    if not isinstance(identity, str):
        raise ValueError("identity must be text")
    members: dict[str, str] = {}
    if via:
        members["via"] = via
    if identity:
        members["identity"] = identity[:IDENTITY_MAX_LENGTH]
    return members


# The sign-in a browser session was opened with, by Django's record of the backend that
# authenticated it (``_auth_user_backend``): the company's identity provider or a password.
SESSION_SIGN_INS = {
    "runs.oidc.OidcBackend": "session:oidc",
    "runs.ratelimit.LockoutModelBackend": "session:password",
}


def session_identity(session: object) -> str:
    """The identity of a browser session (``session:oidc``, ``session:password``), or
    ``session`` when the session does not say how it was opened."""
    backend = getattr(session, "get", lambda _key: None)("_auth_user_backend")
    return SESSION_SIGN_INS.get(str(backend), SESSION)


def shell_identity() -> str:
    """The identity of a ``manage.py`` command: the operating-system account that ran it
    (``shell:root``), or ``shell`` where the account has no name (a container's uid)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER
        return "shell"
    return f"shell:{user}"[:IDENTITY_MAX_LENGTH]
