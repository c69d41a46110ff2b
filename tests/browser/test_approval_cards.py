"""Issue 24, points 7-10, in Chromium: one approval, three people, three browsers.

A policy of two approvers and no self-approval. Sam started the run; Alice and Bob are
approvers. Each has their own browser context (own session), with the inbox and the run
page open; nothing is reloaded. When Alice approves with an edit and says why, every open
card updates for the person looking at it: Bob's to "1 of 2" with Alice's name, comment
and edit, still his to approve (the button now says it runs the action); Alice's says she
approved and offers no second approval; Sam's says why he may not approve, Approve
disabled. Each badge counts what that person can act on now.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from playwright.sync_api import expect

from runs import services
from runs.approvals import parse_policy
from runs.groups import ensure_default_groups
from runs.models import AgentApprovalPolicy, InputRequest
from tests.browser.conftest import login, open_request, shot, socket_open
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


def person(username: str, *groups: str) -> User:
    ensure_default_groups()
    user = User.objects.create_user(username=username, password=f"pw-{username}")
    for group in groups:
        user.groups.add(Group.objects.get(name=group))
    return user


def opened(page: Any, path: str) -> Any:
    """``page`` at ``path`` with its live socket open, marked so a reload would show."""
    page.goto(path)
    socket_open(page)
    page.evaluate("() => { window.notReloaded = true; }")
    return page


def not_reloaded(page: Any) -> bool:
    return bool(page.evaluate("() => window.notReloaded === true"))


class Tracebacks(logging.Handler):
    """Errors logged while the pages render (a card that could not be rendered, a push
    that failed): there must be none."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.name}: {record.getMessage()}")


@pytest.fixture
def tracebacks() -> Iterator[Tracebacks]:
    handler = Tracebacks()
    loggers = [logging.getLogger(name) for name in ("dashboard", "live", "django.request")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


def asked_in_a_run_started_by(user: User) -> InputRequest:
    run = services.run_start(agent=AGENT, input={"n": 1}, user=user)
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="approve", state={})
    request = services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="auth_required",
        prompt="Approve the TTL change?",
        action=ACTION,
    )
    assert request.run_id == run.id
    return request


def badge(page: Any) -> Any:
    return page.locator("#inbox-count")


def test_three_people_watch_one_approval_and_each_card_is_theirs(
    new_page: Any, tracebacks: Tracebacks
) -> None:
    person("alice", "approver")
    person("bob", "approver")
    sam = person("sam", "operator", "approver")
    AgentApprovalPolicy.objects.create(
        agent=AGENT, policy=parse_policy({"required": 2, "self_approval": False})
    )
    req = asked_in_a_run_started_by(sam)
    run_path = f"/runs/{req.run_id}/"

    pages: dict[str, Any] = {}
    for name in ("alice", "bob", "sam"):
        page = new_page()
        login(page, name)
        pages[name] = page
    alice_inbox = opened(pages["alice"], "/")
    bob_inbox = opened(pages["bob"], "/")
    bob_run = opened(pages["bob"].context.new_page(), run_path)
    # Sam started the run: it is not his to approve, so it is under All pending.
    sam_inbox = opened(pages["sam"], "/?tab=all")
    sam_run = opened(pages["sam"].context.new_page(), run_path)
    expect(badge(alice_inbox)).to_have_text("1")
    expect(badge(bob_inbox)).to_have_text("1")

    # Alice edits the TTL, says why, and gives the first of two approvals. The button
    # says so: it does not run anything yet.
    card = open_request(alice_inbox, req.id)
    expect(card.locator("[data-approvals]")).to_contain_text("0 of 2 approvals")
    card.get_by_text("Edit before approving").click()
    card.get_by_label("TTL").fill("1800")
    card.get_by_label("Comment").fill("3600 outlives the staging session")
    expect(card.get_by_role("button", name=re.compile("^Approve and run"))).to_have_count(0)
    card.get_by_role("button", name="Approve update_auth_config (1 of 2)").click()
    expect(card).to_contain_text("Approval recorded. It needs 1 more approval")

    # Alice: she approved, and is offered no second approval.
    expect(card.locator("[data-approve-blocked]")).to_contain_text("You already approved this")
    expect(card.get_by_role("button", name=re.compile("^Approve"))).to_have_count(0)
    expect(card.get_by_role("button", name="Deny update_auth_config")).to_be_enabled()

    # Bob, without a reload: "1 of 2", Alice's name, her comment and her edit, and the
    # second approval is his to give; the click runs the action now.
    card = open_request(bob_inbox, req.id)
    expect(card.locator("[data-approvals]")).to_contain_text("1 of 2 approvals")
    decisions = card.locator("[data-decisions]")
    expect(decisions).to_contain_text("alice approved with an edit")
    expect(decisions).to_contain_text("3600 outlives the staging session")
    expect(card.locator("[data-edit-shown]")).to_contain_text("Edited by alice: ttl: 3600 → 1800")
    expect(card.locator("pre.diff")).to_have_count(1)
    expect(card).not_to_contain_text("could not be shown")
    approve = card.get_by_role("button", name="Approve and run update_auth_config")
    expect(approve).to_be_enabled()
    # His run page follows too: the count, who approved and why.
    pending = bob_run.locator(f"#request-{req.id}")
    expect(pending.locator("[data-approvals]")).to_contain_text("1 of 2 approvals")
    expect(pending.locator("[data-decisions]")).to_contain_text("3600 outlives the staging session")
    expect(pending.get_by_role("button", name="Approve and run update_auth_config")).to_be_enabled()
    shot(bob_inbox, "issue24-second-approver-live")

    # Sam, on the inbox and on the run page: why he may not approve, Approve disabled; he
    # may still deny or send it back.
    for page in (sam_inbox, sam_run):
        card = page.locator(f"#request-{req.id}")
        if page is sam_inbox:
            card = open_request(page, req.id)
        expect(card.locator("[data-approvals]")).to_contain_text("1 of 2 approvals")
        expect(card.locator("[data-decisions]")).to_contain_text("alice approved with an edit")
        expect(card.locator("[data-approve-blocked]")).to_contain_text(
            "You started this run or answered its last question"
        )
        expect(card.get_by_role("button", name=re.compile("^Approve"))).to_be_disabled()
        expect(card.get_by_role("button", name="Deny update_auth_config")).to_be_enabled()
    shot(sam_run, "issue24-starter-live")
    # Each badge counts what that person can act on now: Bob the second approval; Alice,
    # who gave the first, and Sam, whose run it is, nothing.
    expect(badge(bob_inbox)).to_have_text("1")
    expect(badge(alice_inbox)).to_have_text("0")
    expect(badge(sam_inbox)).to_have_text("0")

    # Bob gives the second approval: every card shows the decision, with both approvers.
    approve.click()
    card = bob_inbox.locator(f"#request-{req.id}")
    expect(card).to_contain_text("Approved with edits by alice and bob")
    expect(sam_run.locator(f"#run-{req.run_id}-status")).to_have_attribute(
        "data-status", re.compile("queued|running")
    )
    expect(badge(bob_inbox)).to_have_text("0")
    assert InputRequest.objects.get(pk=req.id).answer["approvers"] == ["alice", "bob"]
    for page in (alice_inbox, bob_inbox, bob_run, sam_inbox, sam_run):
        assert not_reloaded(page)
    assert tracebacks.records == []


def test_needs_me_opens_the_card_the_link_names_and_counts_what_is_left(
    new_page: Any, tracebacks: Tracebacks
) -> None:
    """A question more urgent than the approval Bob was told about: the link to the
    approval's card opens that card, not the question. Once Alice approved 1 of 2, her
    badge and tab title no longer count it; Bob's still do."""
    person("alice", "approver")
    person("bob", "approver")
    AgentApprovalPolicy.objects.create(agent=AGENT, policy=parse_policy({"required": 2}))
    _run, _lease, _cp, approval = ask(kind="auth_required", action=ACTION, expires_in=3600)
    _run, _lease, _cp, question = ask(expires_in=600)

    bob = new_page()
    login(bob, "bob")
    opened(bob, f"/#request-{approval.id}")
    row = bob.locator(f"#request-{approval.id} details.row-details")
    expect(row).to_have_attribute("open", "")
    expect(bob.locator(f"#request-{question.id} details.row-details")).not_to_have_attribute(
        "open", ""
    )
    # Without a link, the most urgent request Bob can act on opens: the question.
    opened(bob, "/")
    expect(bob.locator(f"#request-{question.id} details.row-details")).to_have_attribute("open", "")
    expect(badge(bob)).to_have_text("2")

    alice = new_page()
    login(alice, "alice")
    opened(alice, "/")
    expect(badge(alice)).to_have_text("2")
    card = open_request(alice, approval.id)
    card.get_by_role("button", name="Approve update_auth_config (1 of 2)").click()
    expect(card.locator("[data-approve-blocked]")).to_contain_text("You already approved this")
    # Alice: only the question is left for her; Bob still has both.
    expect(badge(alice)).to_have_text("1")
    expect(alice.locator("#inbox-tab-count")).to_have_text("1")
    expect(bob.locator(f"#request-{approval.id} [data-approvals]")).to_contain_text(
        "1 of 2 approvals"
    )
    expect(badge(bob)).to_have_text("2")
    # A fresh Needs me for Alice lists only what she can act on; the first row is open.
    alice.goto("/")
    expect(alice.locator("#inbox-list article.request-card")).to_have_count(1)
    expect(alice.locator(f"#request-{question.id} details.row-details")).to_have_attribute(
        "open", ""
    )
    assert not_reloaded(bob)
    assert tracebacks.records == []
