"""The inbox's "Show more" in a real browser: by keyboard with htmx, and without JavaScript."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect

from dashboard.pages.inbox import PAGE
from runs.models import InputRequest
from tests.browser.conftest import login
from tests.dashboard.support import ask, more_pending

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def thirty() -> list[str]:
    """30 pending questions, in the inbox's order (soonest expiry first)."""
    _run, _lease, _cp, req = ask(expires_in=600)
    more_pending(req, 29, first_in=1200)
    return list(
        InputRequest.objects.filter(status="pending")
        .order_by("expires_at", "id")
        .values_list("id", flat=True)
    )


def shown(page: Any) -> list[str]:
    ids = page.locator("#inbox-list article[data-request-card]").evaluate_all(
        "cards => cards.map(c => c.id)"
    )
    return [i.removeprefix("request-") for i in ids]


def test_it_shows_more_by_keyboard_and_says_how_many_came(page: Any, operator: User) -> None:
    expected = thirty()
    login(page, "olivia")
    assert shown(page) == expected[:PAGE]
    expect(page.locator("#inbox-tab-count")).to_have_text("30")
    # Tab order: the control comes right after the last row (its line; the row is closed).
    last = page.locator(f"#request-{expected[PAGE - 1]} summary.row-line")
    last.focus()
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent.trim()") == "Show more"
    page.keyboard.press("Enter")
    expect(page.locator(f"#request-{expected[-1]}")).to_be_visible()
    assert shown(page) == expected
    # Focus moved to the first new card and the status region says what came.
    expect(page.locator(f"#request-{expected[PAGE]}")).to_be_focused()
    expect(page.locator("#inbox-status")).to_have_text("5 more requests shown. No more requests.")
    expect(page.locator("#inbox-more")).to_contain_text("No more requests.")
    page.keyboard.press("Tab")
    assert page.evaluate(
        f"document.getElementById('request-{expected[PAGE]}').contains(document.activeElement)"
    )
    assert page.url.endswith("/")  # the cards came in place; the page did not change


def test_it_opens_the_next_page_without_javascript(new_page: Any, operator: User) -> None:
    expected = thirty()
    page = new_page(javascript=False)
    login(page, "olivia")
    assert shown(page) == expected[:PAGE]
    page.get_by_role("link", name="Show more").click()
    page.wait_for_url(re.compile(r".*cursor=.*"))
    assert shown(page) == expected[PAGE:]
    expect(page.locator("#inbox-tab-count")).to_have_text("30")
    page.get_by_role("link", name="← First page").click()
    page.wait_for_url(re.compile(r".*\?tab=needs$"))
    assert shown(page) == expected[:PAGE]
