"""Issue 28, in Chromium: an approval decided from the e-mail's link. The link opens the
sign-in page when the session is gone, then the confirm page with the card (what will
happen, where, whether it can be undone); the button decides; the link used again says
who decided and when. Agent text on the page stays text."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.core import mail
from playwright.sync_api import expect

from ledger.notifications import notifications_send
from runs.models import ApprovalVote, InputRequest
from tests.browser.conftest import shot
from tests.conftest import _user
from tests.runs.factory import interrupted

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOSTILE_TARGET = "prod/<img src=x onerror=alert(1)>\u202eeulav"


@pytest.fixture(autouse=True)
def _mail(settings: Any, live_server: Any) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.HOLDPOINT_NOTIFY_WEBHOOKS = {}
    settings.HOLDPOINT_PUBLIC_URL = live_server.url


def test_approve_from_the_e_mail_after_signing_in(new_page: Any) -> None:
    alice = _user("alice", "approver")
    alice.email = "alice@example.com"
    alice.save()
    _run, _lease, _cp, req = interrupted(
        kind="auth_required",
        action={
            "tool": "config_store",
            "action": "update_auth_config",
            "target": HOSTILE_TARGET,
            "reversibility": "irreversible",
        },
    )
    notifications_send()
    [message] = mail.outbox
    approve = re.search(r"Approve \(you confirm on the page it opens\): (\S+)", message.body)
    assert approve is not None
    url = approve.group(1)

    page = new_page()
    page.goto(url)
    # No session: the sign-in page first, and back to the link after it.
    expect(page).to_have_url(re.compile(r"/login/\?next=/act/"))
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw-alice")
    page.click("button[type=submit]")
    expect(page.locator("[data-act-form]")).to_be_visible()
    expect(page.locator("h1")).to_have_text("Approve this action?")
    card = page.locator(f"#request-{req.id}")
    expect(card).to_contain_text("Cannot be undone")
    # The agent's target is shown as text, isolated: no element made of it.
    expect(card.locator("img")).to_have_count(0)
    expect(card).to_contain_text("<img src=x onerror=alert(1)>")
    assert InputRequest.objects.get(pk=req.id).status == "pending"  # opening decided nothing
    shot(page, "act-confirm")

    page.fill("#act-comment", "checked the diff")
    page.click("[data-act-submit]")
    expect(page.locator(".flashes .flash-success")).to_contain_text("You approved it")
    expect(page.locator("[data-act-closed]")).to_contain_text("Already approved by alice")
    expect(page.locator("[data-act-form]")).to_have_count(0)
    vote = ApprovalVote.objects.get(request_id=req.id)
    assert (vote.via, vote.comment) == ("email", "checked the diff")
    assert InputRequest.objects.get(pk=req.id).status == "answered"
    shot(page, "act-used")

    # The same link once more, in a new session: it says what happened, and offers nothing.
    again = new_page()
    again.goto(url)
    again.fill("#id_username", "alice")
    again.fill("#id_password", "pw-alice")
    again.click("button[type=submit]")
    expect(again.locator("[data-act-closed]")).to_contain_text("links were used at")
    expect(again.locator("[data-act-form]")).to_have_count(0)
