"""Issue 18 in Chromium: an approval two people must give, edited before approving; the
card says which fields changed as the person types, counts the approvals and names them;
the person who started the run sees why they may not approve it; and after the sweep sent
a reminder or escalated the request, the card says so and the escalation group sees it.

Time is moved for the sweep only (``time_machine``, as tests/ledger/test_notifications.py
does), never for the browser or the live server: nothing waits for minutes to pass.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.core import mail
from django.utils import timezone
from playwright.sync_api import expect

from ledger.notifications import notifications_send
from runs import services
from runs.approvals import parse_policy
from runs.models import AgentApprovalPolicy, InputRequest, Notification
from tests.browser.conftest import login, open_request, shot, socket_open
from tests.conftest import _user
from tests.dashboard.support import ask
from tests.runs.factory import AGENT, claim, epochs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ACTION = {
    "tool": "config_store",
    "action": "update_auth_config",
    "target": "staging/auth/config",
    "change": {"ttl": {"from": 7200, "to": 3600}},
    "reversibility": "reversible",
    "editable": {
        "schema": {
            "type": "object",
            "properties": {"ttl": {"type": "integer", "title": "TTL", "minimum": 60}},
            "required": ["ttl"],
        },
        "value": {"ttl": 3600},
    },
}


def test_two_approvers_and_an_edit_made_before_approving(new_page: Any, approver: User) -> None:
    _user("bob", "approver")
    AgentApprovalPolicy.objects.create(agent=AGENT, policy=parse_policy({"required": 2}))
    _run, _lease, _cp, req = ask(kind="auth_required", action=ACTION)

    alice = new_page()
    login(alice, "alice")
    card = open_request(alice, req.id)
    expect(card.locator("[data-approvals]")).to_contain_text("0 of 2 approvals")
    card.get_by_text("Edit before approving").click()
    diff = card.locator("[data-edit-diff]")
    expect(diff).to_contain_text("Unchanged")
    card.get_by_label("TTL").fill("1800")
    # Said as she types, before anything is sent.
    expect(diff).to_contain_text("Changed from what is planned: TTL: 3600 → 1800")
    shot(alice, "issue18-edit-before-approving")
    # The first of two approvals: the button says so (issue 24).
    card.get_by_role("button", name="Approve update_auth_config (1 of 2)").click()
    expect(card).to_contain_text("Approval recorded. It needs 1 more approval")
    expect(card.locator("[data-approvals]")).to_contain_text("1 of 2 approvals")
    expect(card.locator("[data-decisions]")).to_contain_text("You approved with an edit")
    expect(card.locator("[data-approve-blocked]")).to_contain_text("You already approved this")
    assert InputRequest.objects.get(pk=req.id).edited == {"ttl": 1800}

    bob = new_page()
    login(bob, "bob")
    card = open_request(bob, req.id)
    expect(card.locator("[data-approvals]")).to_contain_text("1 of 2 approvals")
    expect(card.locator("[data-decisions]")).to_contain_text("alice approved with an edit")
    expect(card.locator("[data-edit-shown]")).to_contain_text("Edited by alice")
    expect(card.locator("[data-edit-shown]")).to_contain_text("1800")
    shot(bob, "issue18-second-approver")
    card.get_by_role("button", name="Approve and run update_auth_config").click()
    expect(card).to_contain_text("Approved with edits by alice and bob")
    expect(card.locator("[data-edit-decided]")).to_contain_text("1800")
    req.refresh_from_db()
    assert req.status == "answered"
    assert req.answer == {
        "decision": "approve",
        "edited": {"ttl": 1800},
        "approvers": ["alice", "bob"],
    }


def test_send_back_with_a_comment(new_page: Any, approver: User) -> None:
    _run, _lease, _cp, req = ask(kind="auth_required", action=ACTION)
    page = new_page()
    login(page, "alice")
    card = open_request(page, req.id)
    card.get_by_role("button", name="Send back with a comment").click()
    expect(card).to_contain_text("Write what the agent should change")
    card.get_by_label("Comment").fill("Use 1800, not 3600")
    card.get_by_role("button", name="Send back with a comment").click()
    expect(card).to_contain_text("Sent back by alice")
    req.refresh_from_db()
    assert req.answer == {"decision": "respond", "comment": "Use 1800, not 3600"}


# A stand-in for the browser's own Notification API and page visibility (what the test
# cannot do to a headless tab): it records what the page asks the browser to show.
BACKGROUND_TAB = """
Object.defineProperty(Document.prototype, "hidden", {
  configurable: true, get() { return !!window.__hidden; }
});
window.__notes = [];
window.Notification = function (title) { window.__notes.push(title); };
window.Notification.permission = "granted";
window.Notification.requestPermission = function () { return Promise.resolve("granted"); };
"""


def test_a_background_tab_counts_in_its_title_and_shows_a_notification(
    new_page: Any, approver: User
) -> None:
    import re

    page = new_page()
    page.add_init_script(BACKGROUND_TAB)
    login(page, "alice")
    page.goto("/profile/")
    socket_open(page)
    title = page.title()
    page.evaluate(
        "() => { window.__hidden = true; document.dispatchEvent(new Event('visibilitychange')); }"
    )
    ask(kind="auth_required", action=ACTION)
    expect(page.locator("#inbox-count")).to_have_text("1")
    expect(page).to_have_title("(1) " + title)
    # What is asked (tests/browser/test_notifications.py: the run's label, and the card).
    page.wait_for_function("() => window.__notes.length === 1")
    assert page.evaluate("() => window.__notes") == [
        "Update staging/auth/config via update_auth_config"
    ]
    # Back in front: the title is plain again, and nothing more is shown.
    page.evaluate(
        "() => { window.__hidden = false; document.dispatchEvent(new Event('visibilitychange')); }"
    )
    expect(page).to_have_title(re.compile(r"^[^(]"))


def test_no_browser_notification_for_a_person_who_switched_it_off(
    new_page: Any, approver: User
) -> None:
    from runs.models import NotificationPreference

    NotificationPreference.objects.create(user=approver, browser=False)
    page = new_page()
    page.add_init_script(BACKGROUND_TAB)
    login(page, "alice")
    page.goto("/profile/")
    socket_open(page)
    title = page.title()
    page.evaluate(
        "() => { window.__hidden = true; document.dispatchEvent(new Event('visibilitychange')); }"
    )
    ask(kind="auth_required", action=ACTION)
    expect(page.locator("#inbox-count")).to_have_text("1")
    assert page.title() == title
    assert page.evaluate("() => window.__notes") == []


# --- No self-approval ------------------------------------------------------------------------

SEND = {
    "tool": "email",
    "action": "send_email",
    "target": "ops@example.com",
    "change": {"subject": "Token rotation tonight"},
    "reversibility": "irreversible",
}


def asked_in_a_run_started_by(user: User, action: dict[str, Any]) -> tuple[Any, Any]:
    """An approval asked in a run ``user`` started (through the real services)."""
    run = services.run_start(agent=AGENT, input={"n": 1}, user=user)
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="send", state={})
    req = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="auth_required",
        prompt="Send?",
        action=action,
    )
    return run, req


def test_the_person_who_started_the_run_sees_why_they_may_not_approve_it(
    new_page: Any, approver: User
) -> None:
    # An irreversible effect: by default its policy keeps the run's starter out.
    _user("bob", "approver")
    _run, req = asked_in_a_run_started_by(approver, SEND)
    approve = re.compile(r"^Approve send_email")

    alice = new_page()
    login(alice, "alice")
    # Not hers to approve: under All pending, not Needs me (issue 24).
    expect(alice.locator("#inbox-count")).to_have_text("0")
    alice.goto("/?tab=all")
    card = open_request(alice, req.id)
    blocked = card.locator("[data-approve-blocked]")
    expect(blocked).to_contain_text(
        "You started this run or answered its last question; its policy needs someone else "
        "to approve. You may still deny it or send it back."
    )
    expect(blocked).to_contain_text("Who may approve: bob.")
    expect(card.get_by_role("button", name=approve)).to_be_disabled()
    # Deny and send back stay hers to use.
    expect(card.get_by_role("button", name="Deny send_email")).to_be_enabled()
    expect(card.get_by_role("button", name="Send back with a comment")).to_be_enabled()
    shot(alice, "issue18-no-self-approval")
    # The form posted anyway (the button's disabled state is no guard): refused, with the
    # reason, and nothing recorded.
    fields = card.locator("form.answer-form").evaluate(
        "form => Object.fromEntries(new FormData(form))"
    )
    action_url = card.locator("form.answer-form").get_attribute("action")
    refused = alice.request.post(
        action_url, form={**fields, "decision": "approve"}, headers={"HX-Request": "true"}
    )
    assert refused.status == 403
    assert "You started this run; its policy needs someone else to approve this." in (
        refused.text()
    )
    req.refresh_from_db()
    assert req.status == "pending" and req.decisions == 0

    bob = new_page()
    login(bob, "bob")
    card = open_request(bob, req.id)
    expect(card.locator("[data-approve-blocked]")).to_have_count(0)
    card.get_by_role("button", name=approve).click()
    expect(card).to_contain_text("Approved by bob")
    req.refresh_from_db()
    assert req.status == "answered"
    assert req.answer["decision"] == "approve"


def test_a_person_outside_the_policys_groups_sees_why_and_a_member_decides(
    new_page: Any, approver: User
) -> None:
    managers, _ = Group.objects.get_or_create(name="release-managers")
    _user("dave", "approver").groups.add(managers)
    AgentApprovalPolicy.objects.create(
        agent=AGENT, policy=parse_policy({"groups": ["release-managers"]})
    )
    _run, _lease, _cp, req = ask(kind="auth_required", action=ACTION)

    alice = new_page()
    login(alice, "alice")
    # Not hers to approve: under All pending, not Needs me (issue 24).
    expect(alice.locator("#inbox-count")).to_have_text("0")
    alice.goto("/?tab=all")
    card = open_request(alice, req.id)
    expect(card.locator(".who-can")).to_contain_text(
        "Only members of release-managers may decide this approval. Who may approve: dave."
    )
    for name in ("Approve and run update_auth_config", "Deny update_auth_config"):
        expect(card.get_by_role("button", name=name)).to_be_disabled()

    dave = new_page()
    login(dave, "dave")
    card = open_request(dave, req.id)
    expect(card.locator(".who-can")).to_have_count(0)
    card.get_by_role("button", name="Approve and run update_auth_config").click()
    expect(card).to_contain_text("Approved by dave")
    req.refresh_from_db()
    assert req.status == "answered"


# --- Reminders and escalation ----------------------------------------------------------------

CLOCK = r"(\w{3} \d{1,2}, )?\d{2}:\d{2}"  # "14:02" today, "Nov 28, 14:02" another day


@pytest.fixture
def _mail(settings: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.HOLDPOINT_NOTIFY_REMIND_SHARE = 0.25
    settings.HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS = 60
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = {}


def with_email(user: User) -> User:
    user.email = f"{user.username}@example.com"
    user.save()
    return user


def sweep_later(seconds: float) -> int:
    """The sweep sends what is due ``seconds`` from now (the clock moved for the sweep only);
    return how many messages went."""
    with time_machine.travel(timezone.now() + dt.timedelta(seconds=seconds), tick=False):
        return notifications_send()


@pytest.mark.usefixtures("_mail")
def test_the_card_says_when_the_sweep_sent_a_reminder(new_page: Any, approver: User) -> None:
    with_email(approver)
    with_email(_user("bob", "approver"))
    _run, _lease, _cp, req = ask(kind="auth_required", action=ACTION, expires_in=3600)
    assert notifications_send() == 2  # the pending ones, to alice and bob

    page = new_page()
    login(page, "alice")
    card = open_request(page, req.id)
    notified = card.locator("[data-notified]")
    expect(notified).to_have_text(re.compile(rf"^Notified 2 people {CLOCK}$"))

    # A quarter of the hour left: the reminder is due; a minute before, it was not.
    assert sweep_later(2700 - 60) == 0
    assert sweep_later(2700 + 5) == 2
    assert [m.subject.startswith("[Holdpoint] Reminder:") for m in mail.outbox[-2:]] == [True] * 2
    page.reload()
    card = open_request(page, req.id)
    expect(card.locator("[data-notified]")).to_have_text(
        re.compile(rf"^Notified 2 people {CLOCK}; Reminded 2 people {CLOCK}$")
    )
    shot(page, "issue18-reminded")


@pytest.mark.usefixtures("_mail")
def test_an_escalated_request_says_so_and_the_group_sees_it(new_page: Any, approver: User) -> None:
    with_email(approver)
    carol = with_email(_user("carol", "viewer"))
    on_call, _ = Group.objects.get_or_create(name="on-call")
    carol.groups.add(on_call)
    AgentApprovalPolicy.objects.create(
        agent=AGENT,
        policy=parse_policy(
            {"groups": ["approver"], "escalation": {"after_minutes": 30, "group": "on-call"}}
        ),
    )
    _run, _lease, _cp, req = ask(kind="auth_required", action=ACTION, expires_in=3600)
    assert notifications_send() == 1  # alice, the one approver; carol is not told yet
    assert [m.to for m in mail.outbox] == [["alice@example.com"]]

    # Unanswered after 30 minutes: the sweep escalates to on-call (carol), and only then.
    assert sweep_later(29 * 60) == 0
    assert sweep_later(30 * 60 + 5) == 1
    escalated = mail.outbox[-1]
    assert escalated.to == ["carol@example.com"]
    assert escalated.subject.startswith("[Holdpoint] Escalated:")
    assert Notification.objects.get(request=req, kind="escalation").status == "sent"

    alice = new_page()
    login(alice, "alice")
    card = open_request(alice, req.id)
    expect(card.locator("[data-notified]")).to_have_text(
        re.compile(rf"^Notified 1 person {CLOCK}; Escalated to on-call {CLOCK}$")
    )
    shot(alice, "issue18-escalated")

    # Carol, told by the escalation, finds the request in her inbox ("All pending": as a
    # viewer nothing there is hers to answer, so "Needs me" stays empty), with the same
    # line; she may look but not decide, and the card says who may.
    page = new_page()
    login(page, "carol")
    expect(page.locator("#inbox-count")).to_have_text("0")
    page.goto("/?tab=all")
    card = open_request(page, req.id)
    expect(card.locator("[data-notified]")).to_contain_text("Escalated to on-call")
    expect(card.get_by_role("button", name="Approve and run update_auth_config")).to_be_disabled()
    expect(card.locator(".who-can")).to_contain_text("Only approvers can approve or deny this.")
    # The message's link opens the card on its run page (after signing in, as here).
    url = re.search(r"https?://\S+", escalated.body)
    assert url is not None
    path = url.group(0).split("://", 1)[1].split("/", 1)[1]
    page.goto("/" + path)
    expect(page.locator(f"#request-{req.id}")).to_be_visible()
