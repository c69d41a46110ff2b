"""Sending the notification outbox (``runs/services/notifications.py`` writes it).

The sweep (``notifications_send``, registered in ``ledger/apps.py``) sends what is due,
outside any transaction (STYLE rule 8), one message at a time:

1. **Claim** what goes in the next message, in one short transaction (``FOR UPDATE SKIP
   LOCKED``): one webhook row, or the due e-mail rows of one person (one digest when
   there are several). They become ``sending`` with a lease and one more attempt, and
   the claim commits before anything is sent. Two sweepers never claim the same row; a
   sweeper killed while sending leaves only that message's rows to wait out their lease,
   and everything else due goes with the next sweep at once.
2. **Skip** what is no longer owed: a request decided, expired or cancelled meanwhile,
   and a recipient who may no longer see the run (or, for a pending notice or a reminder,
   may no longer decide it) sends nothing (``person_may`` / ``group_may``).
3. **Send**: e-mail through Django's mail framework (``Message-ID`` made from the key),
   a group's webhook through ``ledger/outbound.py`` (``Idempotency-Key`` header, JSON with
   a Slack-compatible ``text``). At most one e-mail per person per
   ``HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS``: what falls due sooner waits and goes in one
   digest.
4. **Record** ``sent`` (and which message carried it), or back off and try again; after
   ``MAX_ATTEMPTS`` the row is ``failed`` and says why.

A crash between sending and recording means the message goes again with the same key:
delivery is at least once, and once per key for a receiver that honours the key
(docs/notifications.md).

Run data (a label, a prompt, an action's name or target: agent text, untrusted) is
escaped for the channel it goes to, by that channel's one function: ``email_line``,
``slack_text``, ``browser_line``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from ledger import outbound
from ledger.tools import ActionFailed, OutcomeUnknown
from runs.action_links import DECISIONS, ActionLink, link_nonce, sign_link
from runs.approval_notes import note_text
from runs.approvals import policy_of
from runs.models import InputRequest, Notification
from runs.permissions import permission_set, remember_permissions
from runs.services.notifications import (
    APPROVAL_NOT_APPLIED,
    DECIDE,
    LOOK,
    NOT_APPLIED,
    Part,
    group_may,
    person_may,
)
from runs.states import RequestKind, RequestStatus

logger = logging.getLogger(__name__)

# How long the message in flight is left to its sender before another may send it again.
LEASE_SECONDS = 120
MAX_ATTEMPTS = 8
# The most rows one digest carries; the rest go in the next.
MAX_DIGEST = 50
# Where links point when no public address is configured and no server said where it
# serves (``public_url``).
DEFAULT_PUBLIC_URL = "http://localhost:8000"
S = Notification.Status


def backoff_seconds(attempts: int) -> float:
    """30 s, 1 min, 2 min, … at most an hour, after the ``attempts``-th failure."""
    return float(min(3600, 30 * 2 ** max(0, attempts - 1)))


# --- Escaping: one function per channel ------------------------------------------------------

# What breaks a line or reorders it: control characters (C0 with CR and LF, DEL, C1 with
# NEL), the Unicode line and paragraph separators, and the bidi embeddings, overrides and
# isolates (a right-to-left override makes "exe.pdf" of "fdp.exe").
_NOT_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]+")


def _one_line(value: Any, limit: int | None = None) -> str:
    text = " ".join(_NOT_ONE_LINE.sub(" ", str(value)).split())
    if limit is not None and len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def email_line(value: Any, limit: int | None = None) -> str:
    """Run data as one line of an e-mail (the subject, and every single-line fact of the
    body): a CR or LF in a label or an action's name can neither forge a line of the body
    ("Approved already by the CISO, just click …") nor reach a header."""
    return _one_line(value, limit)


def slack_text(value: Any) -> str:
    """A webhook's Slack-compatible ``text``: one line, with ``&``, ``<`` and ``>`` escaped
    as Slack asks (https://api.slack.com/reference/surfaces/formatting#escaping), so that
    ``<!channel>``, ``<!here>``, ``<@U…>`` or ``<https://…|Approve here>`` in run data show
    as written, never as a mention or a link with a disguised address."""
    return _one_line(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def browser_line(value: Any, limit: int = 120) -> str:
    """A browser notification's title or body: one short line of plain text (the
    Notification API shows no markup, so nothing there is HTML)."""
    return _one_line(value, limit)


# --- What a message says ---------------------------------------------------------------------


def _still_owed(request: InputRequest, now: dt.datetime) -> bool:
    return request.status == RequestStatus.PENDING and request.expires_at > now


def what_is_asked(request: InputRequest) -> str:
    """What is asked, as data (each channel escapes it): "Approve update_auth_config on
    staging/auth/config", or the question's prompt (at most 200 characters)."""
    action = request.action if isinstance(request.action, dict) else {}
    if request.kind == RequestKind.AUTH_REQUIRED:
        name = str(action.get("action") or action.get("tool") or "an action")
        target = str(action.get("target") or "")
        return f"Approve {name} on {target}" if target else f"Approve {name}"
    prompt = " ".join(str(request.prompt).split())
    return prompt if len(prompt) <= 200 else prompt[:199] + "…"


def time_left(request: InputRequest, now: dt.datetime) -> str:
    seconds = max(0, int((request.expires_at - now).total_seconds()))
    hours, rest = divmod(seconds, 3600)
    return f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min"


def public_url() -> str:
    """Where links start: ``HOLDPOINT_PUBLIC_URL`` when an operator set it; else the address
    this process serves (``manage.py serve`` sets it when it starts); else
    ``DEFAULT_PUBLIC_URL``."""
    return str(settings.HOLDPOINT_PUBLIC_URL or DEFAULT_PUBLIC_URL).rstrip("/")


def link(request: InputRequest) -> str:
    # Opens only after login: every dashboard page needs a session.
    return f"{public_url()}/runs/{request.run_id}/#request-{request.id}"


ACT_PATH = "/act/"  # dashboard/urls.py's "act" (tests/dashboard/test_action_links.py)


def decision_links(
    row: Notification, request: InputRequest, message_key: str, part: Part = DECIDE
) -> list[tuple[str, str]]:
    """The e-mail's Approve and Deny links for ``request`` (``runs/action_links.py``), as
    (decision, URL): for an approval its recipient may decide, in a message that asks for
    a decision (not the "not applied" one). Each is signed for the recipient and the
    request's current version; the two of one message share a nonce and decide once."""
    if (
        request.kind != RequestKind.AUTH_REQUIRED
        or row.kind == NOT_APPLIED
        or part != DECIDE
        or row.user_id is None
    ):
        return []
    nonce = link_nonce(message_key, request.id)
    return [
        (
            decision,
            public_url()
            + ACT_PATH
            + sign_link(
                ActionLink(
                    request_id=request.id,
                    user_id=row.user_id,
                    decision=decision,
                    edit_round=request.edit_round,
                    nonce=nonce,
                )
            ),
        )
        for decision in DECISIONS
    ]


_LINK_LABEL = {"approve": "Approve", "deny": "Deny"}


def _link_lines(links: list[tuple[str, str]], indent: str = "") -> list[str]:
    return [
        f"{indent}{_LINK_LABEL[decision]} (you confirm on the page it opens): {email_line(url)}"
        for decision, url in links
    ]


_HEADLINE = {
    "pending": "Waiting for you",
    "reminder": "Reminder",
    "escalation": "Escalated",
    NOT_APPLIED: "Not applied",
}


def not_applied_reason(request: InputRequest) -> str:
    """Why an approval was not applied: the message of the attempt that failed
    ``ApprovalNotApplied`` after resuming with it (the runtime's sentence)."""
    from runs.models import Attempt

    message = (
        Attempt.objects.filter(resume_request=request, error_type=APPROVAL_NOT_APPLIED)
        .order_by("-number")
        .values_list("error_message", flat=True)
        .first()
    )
    return str(message or "The run stopped before doing what was approved.")


def _about(row: Notification, request: InputRequest, now: dt.datetime) -> str:
    """The message's second sentence: the time left to decide, or, for an approval that
    was not applied, why; for a request asked again, why it is asked again."""
    if row.kind == NOT_APPLIED:
        return f"Nothing was done: {not_applied_reason(request)}"
    again = note_text(request.context)
    left = f"{time_left(request, now)} left."
    return f"{again} {left}" if again else left


def look_only_note(request: InputRequest, who: str = "You") -> str:
    """Said to a recipient who may see the request but not decide it."""
    note = f"{who} can look at this request but not decide it."
    if request.kind == RequestKind.AUTH_REQUIRED:
        groups = policy_of(request.policy)["groups"]
        if groups:
            note += " Only members of {} may decide it.".format(", ".join(groups))
    return note


def message_facts(row: Notification, now: dt.datetime, part: Part = DECIDE) -> dict[str, Any]:
    """What every message says: what is asked, the run, the time left, the link, and
    whether the recipient may decide. The fields are data, as the run has them; ``text``
    is the one line a Slack-compatible receiver shows, escaped by ``slack_text``."""
    request = row.request
    run = request.run
    asked = what_is_asked(request)
    facts = {
        "kind": row.kind,
        "request_id": request.id,
        "request_kind": request.kind,
        "run_id": run.id,
        "run_label": run.label,
        "agent": run.agent,
        "asked": asked,
        "expires_at": request.expires_at.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        "time_left": time_left(request, now),
        "url": link(request),
        "can_decide": part == DECIDE,
        "idempotency_key": row.key,
    }
    if row.kind == "escalation" and row.group:
        facts["escalated_to"] = row.group
    note = f" {look_only_note(request, row.group or 'You')}" if part == LOOK else ""
    if row.kind == NOT_APPLIED:
        facts["not_applied"] = not_applied_reason(request)
    facts["text"] = slack_text(
        f"{_HEADLINE.get(row.kind, 'Holdpoint')}: {asked} ({run.label}). "
        f"{_about(row, request, now)}{note} {facts['url']}"
    )
    return facts


def _message_id(key: str) -> str:
    return f"<{hashlib.sha256(key.encode()).hexdigest()[:32]}@holdpoint>"


def _send_email(
    rows: list[Notification], now: dt.datetime, parts: dict[int, Part] | None = None
) -> str:
    """One message to one person for ``rows`` (a digest when more than one); its key.
    ``parts``: what the person may do about each row's request (by row id; decide when
    not said)."""
    user = rows[0].user
    assert user is not None
    parts = parts or {}
    if len(rows) == 1:
        row = rows[0]
        key = row.key
        request, run = row.request, row.request.run
        asked = email_line(what_is_asked(request))
        subject = f"[Holdpoint] {_HEADLINE.get(row.kind, '')}: {asked} ({email_line(run.label)})"
        lines = [asked, ""]
        if row.kind == NOT_APPLIED:
            lines += [
                "What you approved was not done.",
                email_line(not_applied_reason(request), limit=1000),
                "",
            ]
        elif note_text(request.context):
            lines += [email_line(note_text(request.context), limit=1000), ""]
        if parts.get(row.pk, DECIDE) == LOOK and row.kind != NOT_APPLIED:
            lines += [email_line(look_only_note(request)), ""]
        lines += [f"Run: {email_line(run.label)} ({email_line(run.agent)})"]
        if row.kind != NOT_APPLIED:
            lines += [
                f"Time left: {time_left(request, now)} (until "
                f"{request.expires_at.astimezone(dt.UTC).isoformat().replace('+00:00', 'Z')})"
            ]
        lines += [""]
        lines += _link_lines(decision_links(row, request, key, parts.get(row.pk, DECIDE)))
        lines += [f"Open it (after signing in): {email_line(link(request))}"]
        body = "\n".join(lines) + "\n"
    else:
        digest = hashlib.sha256("|".join(sorted(r.key for r in rows)).encode()).hexdigest()
        key = "digest:" + digest[:32]
        subject = f"[Holdpoint] {len(rows)} requests are waiting for you"
        items = []
        for row in rows:
            request = row.request
            look = (
                " You can look but not decide."
                if parts.get(row.pk, DECIDE) == LOOK and row.kind != NOT_APPLIED
                else ""
            )
            headline = f"{_HEADLINE[NOT_APPLIED]}: " if row.kind == NOT_APPLIED else ""
            item = (
                f"- {headline}{email_line(what_is_asked(request))} "
                f"({email_line(request.run.label)}): "
                f"{email_line(_about(row, request, now), limit=600)}{look} "
                f"{email_line(link(request))}"
            )
            links = decision_links(row, request, key, parts.get(row.pk, DECIDE))
            items.append("\n".join([item, *_link_lines(links, indent="  ")]))
        body = "\n\n".join(items)
    message = EmailMessage(
        subject=email_line(subject, limit=300),
        body=body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[user.email],
        headers={"Message-ID": _message_id(key), "X-Holdpoint-Key": key},
    )
    message.send(fail_silently=False)
    return key


def _send_webhook(row: Notification, now: dt.datetime, part: Part = DECIDE) -> None:
    url = settings.HOLDPOINT_NOTIFY_WEBHOOKS.get(row.group)
    if not url:
        raise ActionFailed(f"No webhook is configured for the group {row.group!r}.")
    body = json.dumps(message_facts(row, now, part), ensure_ascii=False).encode()
    reply = outbound.send(
        "POST",
        url,
        headers={"Content-Type": "application/json", "Idempotency-Key": row.key},
        body=body,
        timeout=float(settings.HOLDPOINT_WEBHOOK_TIMEOUT_SECONDS),
    )
    if not 200 <= reply.status < 300:
        raise ActionFailed(f"The webhook answered {reply.status}.")


# --- Claiming one message at a time ----------------------------------------------------------


@dataclass
class _Message:
    """The rows one message carries (none: the rows looked at needed no message) and what
    the recipient may do about each (by row id)."""

    rows: list[Notification] = field(default_factory=list)
    parts: dict[int, Part] = field(default_factory=dict)


def _due(now: dt.datetime) -> Q:
    return Q(status=S.PENDING, due_at__lte=now) | Q(status=S.SENDING, locked_until__lte=now)


def _skip(ids: list[int], why: str) -> None:
    if ids:
        Notification.objects.filter(pk__in=ids).update(
            status=S.SKIPPED, locked_until=None, last_error=why
        )


def _persons_mail(person: int, now: dt.datetime, busy: set[int]) -> list[int]:
    """The ids of ``person``'s due e-mail rows, for their next message (locked in the
    claim's transaction); none when another sweeper has their mail in hand."""
    # One sweeper at a time composes a person's mail (their digest, their one message a
    # minute): the person's row is the lock, taken without waiting. NO KEY: new outbox
    # rows that refer to the person are not held up by it.
    mine = (
        get_user_model()
        .objects.select_for_update(skip_locked=True, no_key=True)
        .filter(pk=person)
        .values_list("pk", flat=True)
    )
    if not list(mine):
        busy.add(person)
        return []
    # A message to them still in flight (a slow sender's, or a killed one's until its lease
    # runs out) counts as their last e-mail from when it was claimed (``_too_soon``): what
    # falls due after it waits out the interval, not the in-doubt message's whole lease.
    return list(
        Notification.objects.select_for_update(skip_locked=True)
        .filter(_due(now), user_id=person, channel="email")
        .order_by("due_at", "id")
        .values_list("id", flat=True)[:MAX_DIGEST]
    )


def _too_soon(person: int, message: _Message, now: dt.datetime) -> bool:
    """Whether ``person``'s last e-mail went less than the interval ago; if so, the rows
    of ``message`` wait until it has passed, and then go together in one digest."""
    interval = dt.timedelta(seconds=settings.HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS)
    # The last that went, and one in flight (it went, or may have gone, when it was
    # claimed: its lease's start), in one read.
    seen = Notification.objects.filter(user_id=person, channel="email").aggregate(
        last=Max("sent_at", filter=Q(status=S.SENT)),
        held=Max("locked_until", filter=Q(status=S.SENDING, locked_until__gt=now)),
    )
    last, held = seen["last"], seen["held"]
    if held is not None:
        claimed = held - dt.timedelta(seconds=LEASE_SECONDS)
        last = claimed if last is None else max(last, claimed)
    if last is None or now - last >= interval:
        return False
    Notification.objects.filter(pk__in=[row.pk for row in message.rows]).update(
        status=S.PENDING, due_at=last + interval, locked_until=None
    )
    return True


def _settle(ids: list[int], now: dt.datetime) -> _Message:
    """Of the rows ``ids`` (locked), skip those owed nothing any more; the rest, with what
    their recipient may do, make the message."""
    rows = list(
        Notification.objects.select_related("request", "request__run", "user")
        .filter(pk__in=ids)
        .order_by("due_at", "id")
    )
    message = _Message()
    gone, unseen, undecided, nowhere = [], [], [], []
    person = rows[0].user if rows and rows[0].channel == "email" else None
    if person is not None and person.is_active:
        # Their permissions in one query, for every row of their message.
        remember_permissions(person, permission_set(person))
    for row in rows:
        # A "not applied" message is about a request that was answered: the approvers are
        # told what became of their approval whatever the request's state is now.
        if row.kind != NOT_APPLIED and not _still_owed(row.request, now):
            gone.append(row.pk)
            continue
        if row.channel == "email":
            if person is None or not person.email:
                nowhere.append(row.pk)
                continue
            part = person_may(row.request, person)
        elif row.channel in ("webhook", "slack"):
            part = group_may(row.request, row.group)
        else:
            nowhere.append(row.pk)
            continue
        if part is None:
            unseen.append(row.pk)
        elif part == LOOK and row.kind not in ("escalation", NOT_APPLIED):
            # "Waiting for you" is for someone who may decide; an escalation tells the
            # others of its group that they can only look.
            undecided.append(row.pk)
        else:
            if person is not None:
                row.user = person
            message.rows.append(row)
            message.parts[row.pk] = part
    _skip(gone, "The request is no longer pending.")
    _skip(unseen, "The recipient may not see this run.")
    _skip(undecided, "The recipient may not decide this request.")
    _skip(nowhere, "No address to send to.")
    return message


def _claim_next(busy: set[int]) -> _Message | None:
    """Claim the next message: one webhook row, or one person's due e-mail rows. None
    when nothing is due; a message without rows when what was looked at needed none
    (skipped, deferred, or its person's mail is another sweeper's): claim again."""
    now = timezone.now()
    with transaction.atomic():
        due = Notification.objects.select_for_update(skip_locked=True).filter(_due(now))
        if busy:
            due = due.exclude(user_id__in=busy)
        # notification_due_idx serves this: due rows, oldest first.
        first = due.order_by("due_at", "id").values_list("id", "channel", "user_id").first()
        if first is None:
            return None
        row_id, channel, person = first
        ids = _persons_mail(person, now, busy) if channel == "email" and person else [row_id]
        if not ids:
            return _Message()
        message = _settle(ids, now)
        if message.rows and channel == "email" and _too_soon(person, message, now):
            return _Message()
        claimed = [row.pk for row in message.rows]
        if claimed:
            Notification.objects.filter(pk__in=claimed).update(
                status=S.SENDING,
                locked_until=now + dt.timedelta(seconds=LEASE_SECONDS),
                attempts=F("attempts") + 1,
            )
            for row in message.rows:
                row.status, row.attempts = S.SENDING, row.attempts + 1
    return message


def _sent(ids: list[int], message_key: str) -> None:
    Notification.objects.filter(pk__in=ids, status=S.SENDING).update(
        status=S.SENT,
        sent_at=timezone.now(),
        message_key=message_key,
        locked_until=None,
        last_error="",
    )


def _failed(rows: list[Notification], error: str) -> None:
    now = timezone.now()
    for row in rows:
        attempts = row.attempts
        if attempts >= MAX_ATTEMPTS:
            update: dict[str, Any] = {"status": S.FAILED, "locked_until": None}
        else:
            update = {
                "status": S.PENDING,
                "due_at": now + dt.timedelta(seconds=backoff_seconds(attempts)),
                "locked_until": None,
            }
        Notification.objects.filter(pk=row.pk, status=S.SENDING).update(
            last_error=error[:2000], **update
        )


def _send(message: _Message) -> bool:
    """Send one claimed message and record how it went; whether it went."""
    now = timezone.now()
    first = message.rows[0]
    if first.channel in ("webhook", "slack"):
        try:
            if first.channel == "slack":
                from ledger.slack import post_request

                post_request(first, now)
            else:
                _send_webhook(first, now, message.parts[first.pk])
        except (ActionFailed, OutcomeUnknown) as exc:
            logger.warning("notification %s: %s", first.key, exc)
            _failed([first], str(exc))
            return False
        _sent([first.pk], first.key)
        return True
    try:
        key = _send_email(message.rows, now, message.parts)
    except Exception as exc:  # noqa: BLE001 - SMTP and backends raise many kinds; each is a retry
        logger.warning("notification e-mail to user %s failed: %s", first.user_id, exc)
        _failed(message.rows, f"{type(exc).__name__}: {exc}")
        return False
    _sent([row.pk for row in message.rows], key)
    return True


def notifications_send(*, limit: int = 100) -> int:
    """Send what is due, one message at a time (at most ``limit`` claims); return how many
    messages were sent."""
    sent = 0
    # People whose mail another sweeper is composing or sending: left to it in this sweep.
    busy: set[int] = set()
    for _ in range(limit):
        message = _claim_next(busy)
        if message is None:
            break
        if message.rows and _send(message):
            sent += 1
    return sent
