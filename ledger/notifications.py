"""Sending the notification outbox (``runs/services/notifications.py`` writes it).

The sweep (``notifications_send``, registered in ``ledger/apps.py``) sends what is due,
outside any transaction (STYLE rule 8):

1. **Claim** due rows in one short transaction (``FOR UPDATE SKIP LOCKED``): they become
   ``sending`` with a lease and one more attempt, and the claim commits before anything
   is sent. Two sweepers never claim the same row; a sweeper that crashes lets its lease
   run out and the row is claimed again.
2. **Skip** what is no longer owed: a request decided, expired or cancelled meanwhile
   sends nothing further.
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
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections import defaultdict
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from ledger import outbound
from ledger.tools import ActionFailed, OutcomeUnknown
from runs.models import InputRequest, Notification
from runs.states import RequestKind, RequestStatus

logger = logging.getLogger(__name__)

LEASE_SECONDS = 120
MAX_ATTEMPTS = 8
S = Notification.Status


def backoff_seconds(attempts: int) -> float:
    """30 s, 1 min, 2 min, … at most an hour, after the ``attempts``-th failure."""
    return float(min(3600, 30 * 2 ** max(0, attempts - 1)))


def _claim(limit: int) -> list[int]:
    now = timezone.now()
    with transaction.atomic():
        ids = list(
            Notification.objects.select_for_update(skip_locked=True)
            .filter(
                Q(status=S.PENDING, due_at__lte=now) | Q(status=S.SENDING, locked_until__lte=now)
            )
            .order_by("due_at", "id")
            .values_list("id", flat=True)[:limit]
        )
        Notification.objects.filter(pk__in=ids).update(
            status=S.SENDING,
            locked_until=now + dt.timedelta(seconds=LEASE_SECONDS),
            attempts=F("attempts") + 1,
        )
    return ids


def _still_owed(request: InputRequest, now: dt.datetime) -> bool:
    return request.status == RequestStatus.PENDING and request.expires_at > now


def what_is_asked(request: InputRequest) -> str:
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


def link(request: InputRequest) -> str:
    # Opens only after login: every dashboard page needs a session.
    return f"{settings.HOLDPOINT_PUBLIC_URL}/runs/{request.run_id}/#request-{request.id}"


_HEADLINE = {"pending": "Waiting for you", "reminder": "Reminder", "escalation": "Escalated"}


def message_facts(row: Notification, now: dt.datetime) -> dict[str, Any]:
    """What every message says: what is asked, the run, the time left, the link."""
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
        "idempotency_key": row.key,
    }
    if row.kind == "escalation" and row.group:
        facts["escalated_to"] = row.group
    facts["text"] = (
        f"{_HEADLINE.get(row.kind, 'Holdpoint')}: {asked} ({run.label}). "
        f"{facts['time_left']} left. {facts['url']}"
    )
    return facts


def _message_id(key: str) -> str:
    return f"<{hashlib.sha256(key.encode()).hexdigest()[:32]}@holdpoint>"


def _send_email(rows: list[Notification], now: dt.datetime) -> str:
    """One message to one person for ``rows`` (a digest when more than one); its key."""
    user = rows[0].user
    assert user is not None
    facts = [message_facts(row, now) for row in rows]
    if len(rows) == 1:
        key = rows[0].key
        one = facts[0]
        subject = (
            f"[Holdpoint] {_HEADLINE.get(one['kind'], '')}: {one['asked']} ({one['run_label']})"
        )
        body = (
            f"{one['asked']}\n\nRun: {one['run_label']} ({one['agent']})\n"
            f"Time left: {one['time_left']} (until {one['expires_at']})\n\n"
            f"Open it (after signing in): {one['url']}\n"
        )
    else:
        digest = hashlib.sha256("|".join(sorted(r.key for r in rows)).encode()).hexdigest()
        key = "digest:" + digest[:32]
        subject = f"[Holdpoint] {len(rows)} requests are waiting for you"
        body = "\n\n".join(
            f"- {f['asked']} ({f['run_label']}): {f['time_left']} left. {f['url']}" for f in facts
        )
    subject = " ".join(subject.split())[:300]
    message = EmailMessage(
        subject=subject,
        body=body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[user.email],
        headers={"Message-ID": _message_id(key), "X-Holdpoint-Key": key},
    )
    message.send(fail_silently=False)
    return key


def _send_webhook(row: Notification, now: dt.datetime) -> None:
    url = settings.HOLDPOINT_NOTIFY_WEBHOOKS.get(row.group)
    if not url:
        raise ActionFailed(f"No webhook is configured for the group {row.group!r}.")
    body = json.dumps(message_facts(row, now), ensure_ascii=False).encode()
    reply = outbound.send(
        "POST",
        url,
        headers={"Content-Type": "application/json", "Idempotency-Key": row.key},
        body=body,
        timeout=float(settings.HOLDPOINT_WEBHOOK_TIMEOUT_SECONDS),
    )
    if not 200 <= reply.status < 300:
        raise ActionFailed(f"The webhook answered {reply.status}.")


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


def notifications_send(*, limit: int = 100) -> int:
    """Send what is due (at most ``limit`` rows); return how many messages were sent."""
    ids = _claim(limit)
    if not ids:
        return 0
    now = timezone.now()
    rows = list(
        Notification.objects.select_related("request", "request__run", "user")
        .filter(pk__in=ids, status=S.SENDING)
        .order_by("due_at", "id")
    )
    owed = [r for r in rows if _still_owed(r.request, now)]
    gone = [r.pk for r in rows if r not in owed]
    if gone:
        Notification.objects.filter(pk__in=gone, status=S.SENDING).update(
            status=S.SKIPPED, locked_until=None, last_error="The request is no longer pending."
        )
    sent = 0
    by_person: dict[int, list[Notification]] = defaultdict(list)
    for row in owed:
        if row.channel == "email" and row.user is not None and row.user.email:
            by_person[row.user.pk].append(row)
        elif row.channel == "webhook":
            try:
                _send_webhook(row, now)
            except (ActionFailed, OutcomeUnknown) as exc:
                logger.warning("notification %s: %s", row.key, exc)
                _failed([row], str(exc))
            else:
                _sent([row.pk], row.key)
                sent += 1
        else:
            Notification.objects.filter(pk=row.pk, status=S.SENDING).update(
                status=S.SKIPPED, locked_until=None, last_error="No address to send to."
            )
    interval = dt.timedelta(seconds=settings.HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS)
    for person, mine in by_person.items():
        last = Notification.objects.filter(
            user_id=person, channel="email", status=S.SENT
        ).aggregate(last=Max("sent_at"))["last"]
        if last is not None and now - last < interval:
            # Too soon after the last message: these wait, and go together in one digest.
            Notification.objects.filter(pk__in=[r.pk for r in mine], status=S.SENDING).update(
                status=S.PENDING,
                due_at=last + interval,
                locked_until=None,
                attempts=F("attempts") - 1,
            )
            continue
        try:
            key = _send_email(mine, now)
        except Exception as exc:  # noqa: BLE001 - SMTP and backends raise many kinds; each is a retry
            logger.warning("notification e-mail to user %s failed: %s", person, exc)
            _failed(mine, f"{type(exc).__name__}: {exc}")
        else:
            _sent([r.pk for r in mine], key)
            sent += 1
    return sent
