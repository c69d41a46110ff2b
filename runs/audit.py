"""How a decision or a control operation was made: the door and the credential.

Every service that records a person's decision or a control operation (start, resume,
answer, approve, cancel, retry, pause, continue, an agent's pause and unpause) takes
``via`` and ``identity`` keyword arguments, both "" by default, and puts them in the
payloads of the events it writes through ``runs.events.how``: the one place that says what
the two members are, beside the events they go in. This module is their vocabulary.
``via`` is the door:

- ``dashboard``: a form of the web pages (identity ``session:oidc`` or
  ``session:password``: how the session was signed in, ``runs.services.session_identity``);
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

# Changes people make to an agent as a whole, by the event that records each: the rules of
# the tools it calls through the MCP gateway (``runs.models.AgentEvent``, written by
# ``ledger.services.tool_rules``). The audit trail reads them beside the runs' events.
TOOL_RULE_CONFIRMED = "tool_rule.confirmed"
AGENT_AUDIT_EVENT_TYPES: tuple[str, ...] = (TOOL_RULE_CONFIRMED,)


# The sign-in a browser session was opened with, by Django's record of the backend that
# authenticated it (``_auth_user_backend``): the company's identity provider or a password.
SESSION_SIGN_INS = {
    "runs.oidc.OidcBackend": "session:oidc",
    "runs.ratelimit.LockoutModelBackend": "session:password",
}


def shell_identity() -> str:
    """The identity of a ``manage.py`` command: the operating-system account that ran it
    (``shell:root``), or ``shell`` where the account has no name (a container's uid)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER
        return "shell"
    return f"shell:{user}"[:IDENTITY_MAX_LENGTH]
