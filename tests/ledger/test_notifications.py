"""The notification outbox (issue 18): written with the request, sent by the sweep outside
any transaction, once per key (two sweepers at once too, on PostgreSQL), at most one e-mail
per person per minute (a digest for the rest), reminders, escalation, nothing after a
decision, per-person opt-out, group webhooks."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.core import mail
from django.db import transaction
from django.utils import timezone

from ledger.notifications import MAX_ATTEMPTS, notifications_send
from runs import services
from runs.approvals import parse_policy
from runs.models import AgentApprovalPolicy, Notification, NotificationPreference
from tests.conftest import _user
from tests.runs.factory import AGENT, interrupted
from tests.runs.test_races import ROUNDS, race
from tests.security.outbound_receiver import Recorder, json_body, recording_receiver

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _notify_settings(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.HOLDPOINT_NOTIFY_REMIND_SHARE = 0.25
    settings.HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS = 60
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = {}
    settings.HOLDPOINT_PUBLIC_URL = "https://holdpoint.example"


def person(name: str, group: str = "approver") -> User:
    user = _user(name, group)
    user.email = f"{name}@example.com"
    user.save()
    return user


def approval(policy: dict[str, Any] | None = None, expires_in: float = 3600) -> Any:
    if policy is not None:
        AgentApprovalPolicy.objects.update_or_create(
            agent=AGENT, defaults={"policy": parse_policy(policy)}
        )
    return interrupted(kind="auth_required", expires_in=expires_in)


def later(seconds: float) -> Any:
    return time_machine.travel(timezone.now() + dt.timedelta(seconds=seconds), tick=False)


def test_the_rows_commit_with_the_request_one_per_recipient_and_kind() -> None:
    alice, bob = person("alice"), person("bob")
    person("olivia", "operator")  # may not approve: owed nothing
    _run, _lease, _cp, req = approval()
    keys = set(Notification.objects.filter(request=req).values_list("key", flat=True))
    assert keys == {
        f"{req.id}:user:{alice.pk}:pending",
        f"{req.id}:user:{bob.pk}:pending",
        f"{req.id}:user:{alice.pk}:reminder",
        f"{req.id}:user:{bob.pk}:reminder",
    }
    reminder = Notification.objects.get(key=f"{req.id}:user:{alice.pk}:reminder")
    # When a quarter of the hour is left.
    assert abs((req.expires_at - reminder.due_at).total_seconds() - 900) < 5


def test_no_row_when_the_question_is_refused(settings: Any) -> None:
    person("alice")
    from runs.errors import HoldpointError

    with pytest.raises(HoldpointError):
        interrupted(kind="auth_required", action={"no": "tool"})
    assert not Notification.objects.exists()


def test_the_sweep_sends_each_person_one_e_mail_with_the_facts_and_a_link() -> None:
    person("alice"), person("bob")
    run, _lease, _cp, req = approval()
    assert notifications_send() == 2
    assert sorted(m.to[0] for m in mail.outbox) == ["alice@example.com", "bob@example.com"]
    message = mail.outbox[0]
    assert "Approve config_store on staging/auth/config" in message.subject
    assert run.label in message.body
    assert "Time left: 59 min" in message.body or "Time left: 1 h 0 min" in message.body
    assert f"https://holdpoint.example/runs/{run.id}/#request-{req.id}" in message.body
    assert message.extra_headers["X-Holdpoint-Key"].endswith(":pending")
    # Sent once: the sweep again sends nothing.
    assert notifications_send() == 0
    assert len(mail.outbox) == 2
    sent = Notification.objects.filter(kind="pending")
    assert set(sent.values_list("status", flat=True)) == {"sent"}


def test_more_messages_within_a_minute_are_folded_into_one_digest() -> None:
    alice = person("alice")
    _r1, _l1, _c1, first = approval()
    notifications_send()
    assert len(mail.outbox) == 1
    services.run_cancel(run_id=first.run_id, reason="next")
    _r2, _l2, _c2, second = approval()
    _r3, _l3, _c3, third = interrupted(kind="input_required")
    assert notifications_send() == 0  # too soon after the first message
    assert len(mail.outbox) == 1
    waiting = Notification.objects.filter(user=alice, status="pending", kind="pending")
    assert waiting.count() == 2
    with later(61):
        assert notifications_send() == 1
    assert len(mail.outbox) == 2
    digest = mail.outbox[1]
    assert "2 requests are waiting for you" in digest.subject
    assert second.id in digest.body and third.id in digest.body
    keys = set(
        Notification.objects.filter(
            user=alice, kind="pending", request__in=[second, third]
        ).values_list("message_key", flat=True)
    )
    assert len(keys) == 1 and next(iter(keys)).startswith("digest:")


def test_a_reminder_goes_when_a_quarter_is_left_and_nothing_after_a_decision() -> None:
    alice = person("alice")
    _run, _lease, _cp, req = approval()
    notifications_send()
    with later(2700 + 5):
        assert notifications_send() == 1
    assert mail.outbox[-1].subject.startswith("[Holdpoint] Reminder:")
    # A decided request sends nothing further: its reminder is skipped.
    services.run_cancel(run_id=req.run_id, reason="done")
    _r, _l, cp2, req2 = approval()
    notifications_send()  # the pending ones, to alice
    services.run_resume(
        run_id=req2.run_id,
        request_id=req2.id,
        checkpoint_id=cp2.id,
        value={"decision": "deny", "comment": "no"},
        user=person("bob"),
    )
    before = len(mail.outbox)
    with later(2700 + 5):
        assert notifications_send() == 0
    assert len(mail.outbox) == before
    skipped = Notification.objects.get(request=req2, user=alice, kind="reminder")
    assert skipped.status == "skipped"


def test_escalation_goes_to_the_escalation_group_after_n_minutes() -> None:
    person("alice")
    Group.objects.get_or_create(name="on-call")
    carol = person("carol", "viewer")
    carol.groups.add(Group.objects.get(name="on-call"))
    _run, _lease, _cp, req = approval({"escalation": {"after_minutes": 30, "group": "on-call"}})
    escalation = Notification.objects.get(request=req, kind="escalation")
    assert escalation.user == carol and escalation.group == "on-call"
    notifications_send()
    assert [m.to for m in mail.outbox] == [["alice@example.com"]]
    with later(30 * 60 + 5):
        notifications_send()
    assert mail.outbox[-1].to == ["carol@example.com"]
    assert mail.outbox[-1].subject.startswith("[Holdpoint] Escalated:")


def test_a_person_who_switched_e_mail_off_is_not_written_to() -> None:
    alice, bob = person("alice"), person("bob")
    NotificationPreference.objects.create(user=alice, email=False)
    _run, _lease, _cp, req = approval()
    assert set(Notification.objects.filter(request=req).values_list("user", flat=True)) == {bob.pk}


@pytest.fixture
def receiver(settings: Any) -> Iterator[Recorder]:
    settings.HOLDPOINT_OUTBOUND_ALLOW_LOCAL = True
    with recording_receiver() as recorder:
        settings.HOLDPOINT_NOTIFY_WEBHOOKS = {"approver": recorder.url("/hooks/approvers")}
        yield recorder


def test_a_groups_webhook_gets_slack_compatible_json_with_the_key(receiver: Recorder) -> None:
    run, _lease, _cp, req = approval()
    assert Notification.objects.filter(request=req, channel="webhook").count() == 2
    assert notifications_send() == 1
    (seen,) = receiver.seen
    body = json_body(seen)
    assert seen.path == "/hooks/approvers"
    assert seen.headers["Idempotency-Key"] == f"{req.id}:group:approver:pending"
    assert body["text"].startswith("Waiting for you: Approve config_store on staging/auth/config")
    assert body["run_label"] == run.label and body["request_id"] == req.id
    assert body["url"] == f"https://holdpoint.example/runs/{run.id}/#request-{req.id}"


def test_a_failing_webhook_is_retried_with_backoff_then_marked_failed(
    receiver: Recorder,
) -> None:
    receiver.status = 503
    _run, _lease, _cp, req = approval(expires_in=86400)
    notifications_send()
    row = Notification.objects.get(request=req, channel="webhook", kind="pending")
    assert row.status == "pending" and row.attempts == 1 and "503" in row.last_error
    assert 25 < (row.due_at - timezone.now()).total_seconds() <= 31
    moved = timezone.now()
    for _ in range(MAX_ATTEMPTS):
        moved += dt.timedelta(hours=1, seconds=1)
        with time_machine.travel(moved, tick=False):
            notifications_send()
    row.refresh_from_db()
    assert row.status == "failed" and row.attempts == MAX_ATTEMPTS
    assert len([s for s in receiver.seen if s.headers["Idempotency-Key"] == row.key]) == (
        MAX_ATTEMPTS
    )


def test_a_sender_that_crashed_mid_send_leaves_it_to_the_next_with_the_same_key() -> None:
    person("alice")
    _run, _lease, _cp, req = approval()
    row = Notification.objects.get(request=req, kind="pending")
    # A sweeper claimed it (committed) and died before recording the outcome.
    with transaction.atomic():
        Notification.objects.filter(pk=row.pk).update(
            status="sending", attempts=1, locked_until=timezone.now() + dt.timedelta(seconds=120)
        )
    assert notifications_send() == 0  # its lease is still running
    with later(121):
        assert notifications_send() == 1
    (message,) = mail.outbox
    assert message.extra_headers["X-Holdpoint-Key"] == row.key
    row.refresh_from_db()
    assert row.status == "sent" and row.attempts == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("state", ["due", "lease ran out"])
def test_two_sweepers_at_once_send_one_message_per_key_and_record_it_sent_once(
    settings: Any, state: str
) -> None:
    """Two sweepers (threads released together) on one notification that is due, or whose
    sweeper died holding it (``sending``, its lease run out): one claims it and sends it,
    the other finds nothing; the real mail backend (locmem, which every thread shares)
    holds one message with its key, and the row is ``sent`` once, with one more attempt.
    Repeated 25 times per state.

    How this fails: if the claim read due rows without ``FOR UPDATE SKIP LOCKED`` (or
    committed only after sending), both sweepers would take the row and send it, two
    messages with one key; if recording did not check the row is still the claimer's, the
    loser could write over the winner's outcome (``sent_at``, ``attempts``).
    """
    settings.HOLDPOINT_NOTIFY_REMIND_SHARE = 0  # one row per request: the pending one
    settings.HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS = 0  # each round's message goes at once
    alice = person("alice")
    for _ in range(ROUNDS // 2):
        mail.outbox.clear()
        run, _lease, _cp, req = approval()
        (row,) = Notification.objects.filter(request=req)
        assert (row.status, row.user, row.attempts) == ("pending", alice, 0)
        if state == "lease ran out":
            Notification.objects.filter(pk=row.pk).update(
                status="sending", attempts=1, locked_until=timezone.now() - dt.timedelta(seconds=1)
            )
        first, second = race(notifications_send, notifications_send)
        assert sorted([first, second]) == [0, 1], (first, second)
        assert [m.extra_headers["X-Holdpoint-Key"] for m in mail.outbox] == [row.key]
        assert mail.outbox[0].to == ["alice@example.com"]
        row.refresh_from_db()
        assert (row.status, row.message_key, row.locked_until) == ("sent", row.key, None)
        assert row.attempts == (1 if state == "due" else 2)
        assert row.sent_at is not None and row.last_error == ""
        # And nothing is left for a later sweep.
        assert notifications_send() == 0 and len(mail.outbox) == 1
        services.run_cancel(run_id=run.id, reason="next round")


def test_a_message_in_doubt_holds_the_persons_next_mail_for_one_interval_not_its_lease(
    settings: Any,
) -> None:
    """A sender killed while e-mailing alice leaves that message in doubt for its two-minute
    lease; what falls due for her meanwhile goes one interval after that message was
    claimed. (It waited out the whole lease before: behind 15 killed sweepers in the chaos
    run, an admin's notices sat unsent for minutes.)"""
    settings.HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS = 10
    alice = person("alice")
    _r1, _l1, _c1, first = approval()
    in_doubt = Notification.objects.get(request=first, user=alice, kind="pending")
    Notification.objects.filter(pk=in_doubt.pk).update(
        status="sending", attempts=1, locked_until=timezone.now() + dt.timedelta(seconds=120)
    )
    _r2, _l2, _c2, second = interrupted(kind="input_required")
    assert notifications_send() == 0  # within the interval of the message in doubt
    with later(11):
        assert notifications_send() == 1
    (message,) = mail.outbox
    assert message.extra_headers["X-Holdpoint-Key"] == f"{second.id}:user:{alice.pk}:pending"
    in_doubt.refresh_from_db()
    assert in_doubt.status == "sending"  # its own lease still runs
