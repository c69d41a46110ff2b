"""Issue 24, point 14b, in Chromium: the browser notification of a dashboard tab in the
background says what is asked and the run's label (one short line each, whatever the
agent wrote), and clicking it opens that request's card.

Chromium's own Notification API is used (the permission granted to the site, as a
person grants it on their profile page); the page records each notification it makes so
that the test can click it, as a person clicks it on their desktop. Only the tab's
visibility is a stand-in: a headless tab cannot be sent to the background.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from runs.agents import AgentSpec, register_agent_spec
from tests.browser.conftest import login, shot, socket_open
from tests.dashboard.support import ask

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SPY = """
(function () {
  var Real = window.Notification;
  window.__notes = [];
  window.Notification = function (title, options) {
    var note = new Real(title, options);
    window.__notes.push(note);
    return note;
  };
  Object.defineProperty(window.Notification, "permission", { get: function () { return Real.permission; } });
  window.Notification.requestPermission = Real.requestPermission.bind(Real);
})();
Object.defineProperty(Document.prototype, "hidden", {
  configurable: true, get() { return !!window.__hidden; }
});
"""

HOSTILE_TARGET = "staging/auth/config\r\nApproved already by the CISO, just click <b>here</b>"
HOSTILE_SERVICE = "auth\u202egateway\n<!here> https://evil.example/sso"


@pytest.fixture
def labelled(test_agent: AgentSpec) -> Iterator[None]:
    register_agent_spec(
        dataclasses.replace(
            test_agent,
            label="Migrate {service}",
            input_schema={"type": "object", "properties": {"service": {"type": "string"}}},
        )
    )
    yield
    register_agent_spec(test_agent)


def background_tab(new_page: Any, live_server: Any, username: str) -> Any:
    page = new_page()
    page.context.grant_permissions(["notifications"], origin=live_server.url)
    page.add_init_script(SPY)
    login(page, username)
    page.goto("/profile/")
    socket_open(page)
    page.evaluate(
        "() => { window.__hidden = true; document.dispatchEvent(new Event('visibilitychange')); }"
    )
    return page


def test_the_notification_says_what_is_asked_and_the_run_and_opens_its_card(
    new_page: Any, live_server: Any, approver: User, labelled: None
) -> None:
    # A question waits already; the approval that comes next is what she is woken for.
    ask(kind="input_required", input={"service": "billing"})
    page = background_tab(new_page, live_server, "alice")
    expect(page.locator("#inbox-count")).to_have_text("1")
    title = page.title()

    run, _lease, _cp, req = ask(
        kind="auth_required",
        action={
            "tool": "config_store",
            "action": "update_auth_config",
            "target": HOSTILE_TARGET,
            "reversibility": "reversible",
        },
        input={"service": HOSTILE_SERVICE},
    )
    expect(page.locator("#inbox-count")).to_have_text("2")
    expect(page).to_have_title("(2) " + title)
    page.wait_for_function("() => window.__notes.length === 1")
    note = page.evaluate("() => ({title: window.__notes[0].title, body: window.__notes[0].body})")
    # What is asked, on one line: the agent's line break and markup are text, not lines.
    assert note["title"].startswith(
        "Update staging/auth/config Approved already by the CISO, just click <b>here</b>"
    ), note
    assert note["title"].endswith("via update_auth_config"), note
    assert "\n" not in note["title"] and "\r" not in note["title"]
    # The run's label, on one line, with no right-to-left override left in it.
    assert note["body"] == "Migrate auth gateway <!here> https://evil.example/sso", note
    assert "Holdpoint" not in note["title"] and "waiting for a person" not in note["title"]

    # Clicking it opens that request's card (not the question that waited before).
    page.evaluate("() => window.__notes[0].dispatchEvent(new Event('click'))")
    expect(page).to_have_url(re.compile(rf"/runs/{run.id}/#request-{req.id}$"))
    card = page.locator(f"#request-{req.id}")
    expect(card).to_be_visible()
    expect(card.get_by_role("button", name=re.compile("Approve"))).to_be_visible()
    shot(page, "issue24-notification-opens-its-card")


def test_a_long_prompt_is_shortened_to_one_line(
    new_page: Any, live_server: Any, approver: User
) -> None:
    page = background_tab(new_page, live_server, "alice")
    _run, _lease, _cp, req = ask(kind="input_required", prompt="请选择\n需要保持兼容的版本 " * 30)
    page.wait_for_function("() => window.__notes.length === 1")
    note = page.evaluate("() => ({title: window.__notes[0].title, body: window.__notes[0].body})")
    assert note["title"].startswith("请选择 需要保持兼容的版本 请选择"), note
    assert len(note["title"]) <= 120 and note["title"].endswith("…"), note
    page.evaluate("() => window.__notes[0].dispatchEvent(new Event('click'))")
    expect(page.locator(f"#request-{req.id}")).to_be_visible()
