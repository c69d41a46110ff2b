"""Issue 18 in Chromium: an approval two people must give, edited before approving; the
card says which fields changed as the person types, counts the approvals and names them."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from runs.approvals import parse_policy
from runs.models import AgentApprovalPolicy, InputRequest
from tests.browser.conftest import login, open_request, shot
from tests.conftest import _user
from tests.dashboard.support import ask
from tests.runs.factory import AGENT

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
    card.get_by_role("button", name="Approve and run update_auth_config").click()
    expect(card).to_contain_text("Approval recorded. It needs 1 more approval")
    expect(card.locator("[data-approvals]")).to_contain_text("1 of 2 approvals: alice")
    expect(card.locator("[data-approve-blocked]")).to_contain_text("You already approved this")
    assert InputRequest.objects.get(pk=req.id).edited == {"ttl": 1800}

    bob = new_page()
    login(bob, "bob")
    card = open_request(bob, req.id)
    expect(card.locator("[data-approvals]")).to_contain_text("1 of 2 approvals: alice")
    expect(card.locator("[data-edit-shown]")).to_contain_text("Edited by alice")
    expect(card.locator("[data-edit-shown]")).to_contain_text("1800")
    shot(bob, "issue18-second-approver")
    card.get_by_role("button", name="Approve and run update_auth_config").click()
    expect(card).to_contain_text("Approved with edits by bob")
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
document.addEventListener("htmx:wsOpen", function () { window.__wsOpen = true; });
"""


def test_a_background_tab_counts_in_its_title_and_shows_a_notification(
    new_page: Any, approver: User
) -> None:
    import re

    page = new_page()
    page.add_init_script(BACKGROUND_TAB)
    login(page, "alice")
    page.goto("/profile/")
    page.wait_for_function("() => window.__wsOpen === true")
    title = page.title()
    page.evaluate(
        "() => { window.__hidden = true; document.dispatchEvent(new Event('visibilitychange')); }"
    )
    ask(kind="auth_required", action=ACTION)
    expect(page.locator("#inbox-count")).to_have_text("1")
    expect(page).to_have_title("(1) " + title)
    assert page.evaluate("() => window.__notes") == ["Holdpoint: 1 waiting for a person"]
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
    page.wait_for_function("() => window.__wsOpen === true")
    title = page.title()
    page.evaluate(
        "() => { window.__hidden = true; document.dispatchEvent(new Event('visibilitychange')); }"
    )
    ask(kind="auth_required", action=ACTION)
    expect(page.locator("#inbox-count")).to_have_text("1")
    assert page.title() == title
    assert page.evaluate("() => window.__notes") == []
