"""Issue 24, point 12: only people who may see a run are told about it, and for a pending
notice or a reminder only those who may decide it; an escalation tells the members of its
group who may see runs, and those who may not decide are told they can only look.

Who may see a run is the run store's one rule (``runs.selectors``: ``runs.view_run``);
who may decide, the kind's permission and the approval's policy (``runs.approvals``). The
rule holds when the rows are written and again when the sweep sends them: a person who
lost sight of runs meanwhile is not told.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core import mail

from ledger.notifications import notifications_send
from runs import services
from runs.models import Notification
from tests.ledger.test_notifications import approval, later, person
from tests.runs.factory import interrupted
from tests.security.outbound_receiver import Recorder, json_body, recording_receiver

pytestmark = pytest.mark.django_db

ESCALATION = {"escalation": {"after_minutes": 30, "group": "on-call"}}


@pytest.fixture(autouse=True)
def _settings(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.HOLDPOINT_NOTIFY_REMIND_SHARE = 0.25
    settings.HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS = 0
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = {}
    settings.HOLDPOINT_PUBLIC_URL = "https://holdpoint.example"


def on_call(*members: User) -> Group:
    group, _ = Group.objects.get_or_create(name="on-call")
    for member in members:
        member.groups.add(group)
    return group


def grant(user: User, codename: str) -> None:
    user.user_permissions.add(
        Permission.objects.get(codename=codename, content_type__app_label="runs")
    )


def recipients(req: Any, kind: str) -> set[str]:
    return {
        n.user.username
        for n in Notification.objects.filter(request=req, kind=kind, channel="email")
    }


def test_an_escalation_tells_no_member_of_its_group_who_may_not_see_runs() -> None:
    person("alice")
    dave = person("dave", group=None)  # only in on-call: he may see no run
    carol = person("carol", "viewer")
    on_call(dave, carol)
    _run, _lease, _cp, req = approval(ESCALATION)
    assert recipients(req, "escalation") == {"carol"}
    with later(30 * 60 + 5):
        notifications_send()
    told = [m.to[0] for m in mail.outbox if m.subject.startswith("[Holdpoint] Escalated:")]
    assert told == ["carol@example.com"]
    assert not any(m.to == ["dave@example.com"] for m in mail.outbox)


def test_an_escalated_member_who_may_not_decide_is_told_they_can_only_look() -> None:
    person("alice")
    carol = person("carol", "viewer")  # may see, may not approve
    erin = person("erin")  # an approver on call: she may decide
    on_call(carol, erin)
    approval(ESCALATION)
    notifications_send()  # the pending notices, to alice and erin
    with later(30 * 60 + 5):
        notifications_send()
    escalated = {m.to[0]: m for m in mail.outbox if "Escalated" in m.subject}
    assert set(escalated) == {"carol@example.com", "erin@example.com"}
    assert "You can look at this request but not decide it." in escalated["carol@example.com"].body
    assert "can look" not in escalated["erin@example.com"].body


def test_an_approver_who_may_not_see_runs_is_not_told() -> None:
    person("alice")
    # Holds the approve permission on its own, not the one to see runs: every run is "not
    # found" for him, so its label, what it asks and its link are not for him either.
    victor = person("victor", group=None)
    grant(victor, "approve_run")
    _run, _lease, _cp, req = approval()
    assert recipients(req, "pending") == {"alice"}
    notifications_send()
    assert [m.to for m in mail.outbox] == [["alice@example.com"]]


def test_a_question_is_not_told_to_who_may_answer_but_not_see_runs() -> None:
    person("olivia", "operator")
    quinn = person("quinn", group=None)
    grant(quinn, "answer_run")
    _run, _lease, _cp, req = interrupted(kind="input_required")
    assert recipients(req, "pending") == {"olivia"}


def test_a_person_who_lost_sight_of_runs_before_the_reminder_is_not_reminded() -> None:
    alice = person("alice")
    person("bob")
    _run, _lease, _cp, req = approval()
    assert notifications_send() == 2
    alice.groups.clear()  # she leaves the team: she may see no run any more
    with later(2700 + 5):
        assert notifications_send() == 1
    assert mail.outbox[-1].to == ["bob@example.com"]
    row = Notification.objects.get(request=req, user=alice, kind="reminder")
    assert (row.status, row.last_error) == ("skipped", "The recipient may not see this run.")


def test_an_approver_who_already_approved_is_not_reminded_that_it_waits_for_them() -> None:
    alice = person("alice")
    person("bob")
    _run, _lease, cp, req = approval({"required": 2})
    notifications_send()
    services.run_resume(
        run_id=req.run_id,
        request_id=req.id,
        checkpoint_id=cp.id,
        value={"decision": "approve"},
        user=alice,
    )
    with later(2700 + 5):
        assert notifications_send() == 1
    assert mail.outbox[-1].to == ["bob@example.com"]
    row = Notification.objects.get(request=req, user=alice, kind="reminder")
    assert row.status == "skipped"


@pytest.fixture
def receiver(settings: Any) -> Any:
    settings.HOLDPOINT_OUTBOUND_ALLOW_LOCAL = True
    with recording_receiver() as recorder:
        yield recorder


def test_a_groups_webhook_is_told_only_when_the_group_lets_its_members_see_runs(
    receiver: Recorder, settings: Any
) -> None:
    # "release" may approve but not see runs (a group made for the policy, the view
    # permission forgotten); "approver" may do both; "on-call" may see nothing.
    release, _ = Group.objects.get_or_create(name="release")
    release.permissions.add(
        Permission.objects.get(codename="approve_run", content_type__app_label="runs")
    )
    on_call()
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = {
        "release": receiver.url("/hooks/release"),
        "approver": receiver.url("/hooks/approver"),
        "on-call": receiver.url("/hooks/on-call"),
    }
    _run, _lease, _cp, req = approval(
        {"groups": ["release", "approver"], "escalation": {"after_minutes": 30, "group": "on-call"}}
    )
    hooks = set(
        Notification.objects.filter(request=req, channel="webhook").values_list("key", flat=True)
    )
    assert hooks == {f"{req.id}:group:approver:pending", f"{req.id}:group:approver:reminder"}
    with later(30 * 60 + 5):
        notifications_send()
    assert {seen.path for seen in receiver.seen} == {"/hooks/approver"}


def test_an_escalation_webhook_to_a_group_that_may_only_look_says_so(
    receiver: Recorder, settings: Any
) -> None:
    group = on_call()
    group.permissions.add(
        Permission.objects.get(codename="view_run", content_type__app_label="runs")
    )
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = {"on-call": receiver.url("/hooks/on-call")}
    person("alice")
    _run, _lease, _cp, req = approval({"groups": ["approver"], **ESCALATION})
    with later(30 * 60 + 5):
        notifications_send()
    (seen,) = receiver.seen
    body = json_body(seen)
    assert body["kind"] == "escalation" and body["can_decide"] is False
    assert "on-call can look at this request but not decide it." in body["text"]
    assert "Only members of approver may decide it." in body["text"]
    assert req.id in body["text"]
