"""Issue 30, the operations page in Chromium: against a history with known figures it shows
those figures, each links to the filtered list behind it, agent names show as text, and
at 390 px the page does not scroll sideways."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import User
from playwright.sync_api import expect

from tests.browser.conftest import ZONE, login, shot
from tests.runs.stats_history import ALPHA, BETA, seed_history


def test_the_operations_page_shows_the_known_figures_and_leads_to_the_lists(
    page: Any, operator: User
) -> None:
    seed_history()
    login(page, "olivia")
    page.locator("#main-nav").get_by_role("link", name="Operations").click()
    expect(page.locator("h1")).to_have_text("Operations")
    expect(page.locator('#ops-window a[aria-current="page"]')).to_have_text("Last 24 hours")

    # Open requests now: two questions of alpha, one approval of beta.
    expect(page.locator("[data-figure=open-total]")).to_have_text("3")
    alpha = page.locator('#ops-open tr[data-agent="alpha"][data-kind="input_required"]')
    expect(alpha.locator("[data-figure=open]")).to_have_text("2")
    beta = page.locator(f'#ops-open tr[data-agent="{BETA}"]')
    expect(beta.locator("[data-figure=oldest]")).to_have_text(re.compile(r"^(1h 59m|2h 0m)$"))
    # The name is text: no element was made of it.
    expect(beta.locator("td").first).to_have_text(BETA)
    assert page.locator("#ops-open i").count() == 0

    # Runs by outcome, cost, failures, shares, time to answer, workers, lease losses.
    expect(page.locator("[data-figure=runs-succeeded]")).to_have_text("5")
    expect(page.locator("[data-figure=runs-failed]")).to_have_text("2")
    expect(page.locator("[data-figure=runs-cancelled]")).to_have_text("0")
    # Bars of three hours: succeeded (1 h ago), failed (2 h), succeeded and failed (3 h).
    assert page.locator("svg.ops-chart g rect").count() == 4
    assert page.locator("svg.ops-chart rect.ops-failed").count() == 2
    expect(page.locator(f'#ops-cost tr[data-agent="{BETA}"] [data-figure=cost]')).to_have_text("2")
    expect(page.locator('#ops-cost tr[data-agent="alpha"] [data-figure=cost]')).to_have_text(
        "1.7500"
    )
    expect(page.locator('#ops-failures [data-class="transient"] strong')).to_have_text("2")
    expect(page.locator('#ops-failures [data-fingerprint="fpA"]')).to_contain_text(
        "upstream <b>slow</b>"
    )
    expect(page.locator('[data-share="expired"] [data-figure=share]')).to_have_text("16.7 %")
    expect(page.locator('[data-share="denied"] [data-figure=share]')).to_have_text("33.3 %")
    expect(page.locator('[data-share="sent_back"] [data-figure=share]')).to_have_text("33.3 %")
    beta_answers = page.locator(f'#ops-answer-agent tr[data-agent="{BETA}"]')
    expect(beta_answers.locator("[data-figure=p50]")).to_have_text("5m 00s")
    expect(beta_answers.locator("[data-figure=p95]")).to_have_text("9m 30s")
    sre = page.locator('#ops-answer-group tr[data-group="sre"]')
    expect(sre.locator("[data-figure=p50]")).to_have_text("6m 00s")
    expect(page.locator("[data-figure=workers-alive]")).to_have_text("1")
    expect(page.locator("[data-figure=workers-gone]")).to_have_text("1")
    expect(page.locator("[data-figure=lease-losses]")).to_have_text("1")
    shot(page, "operations")

    # Each figure leads to the list behind it.
    alpha.locator("[data-figure=open]").click()
    expect(page).to_have_url(re.compile(r"/runs/\?status=input_required&agent=alpha$"))
    page.go_back()
    page.locator('#ops-failures [data-class="denied"] a').click()
    expect(page).to_have_url(re.compile(r"/runs/\?failure_class=denied$"))
    expect(page.locator(".filter-chip")).to_contain_text("Denied")
    expect(page.locator("#runs-table tbody tr")).to_have_count(1)
    page.go_back()
    page.locator('#ops-cost tr[data-agent="alpha"] a').first.click()
    expect(page).to_have_url(re.compile(r"/runs/\?agent=alpha$"))
    page.go_back()
    page.locator('[data-share="expired"] a').click()
    expect(page).to_have_url(re.compile(r"/\?tab=expired$"))
    page.go_back()
    page.locator("[data-figure=workers-alive]").click()
    expect(page.locator("h1")).to_have_text("Workers")
    page.go_back()

    # The week: the run cancelled 30 hours ago counts there.
    page.locator('#ops-window a[data-window="7d"]').click()
    expect(page.locator('#ops-window a[aria-current="page"]')).to_have_text("Last 7 days")
    expect(page.locator("[data-figure=runs-cancelled]")).to_have_text("1")
    page.locator("[data-status=cancelled]").click()
    expect(page).to_have_url(re.compile(r"/runs/\?status=cancelled$"))
    expect(page.locator("#runs-table tbody tr")).to_have_count(1)
    assert ALPHA in page.locator("#runs-table tbody").inner_text()


def test_the_operations_page_does_not_scroll_sideways_on_a_phone(
    browser: Any, live_server: Any, operator: User
) -> None:
    seed_history()
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": 390, "height": 844}, timezone_id=ZONE
    )
    page = context.new_page()
    try:
        login(page, "olivia")
        for url in ("/operations/", "/operations/?window=7d"):
            page.goto(url)
            expect(page.locator("[data-figure=runs-succeeded]")).to_have_text("5")
            widths = page.evaluate(
                "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
            )
            assert widths[0] <= widths[1], f"{url} scrolls sideways: {widths}"
        shot(page, "operations-phone")
    finally:
        context.close()
