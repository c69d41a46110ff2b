"""Issue 27: a push appends the run timeline's new rows instead of sending it whole. In a
real browser: rows arrive in order, a timeline a reply redrew gets no duplicate rows, and
a filtered timeline is fetched again with its filter, never given other rows."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from playwright.sync_api import expect

from runs import services
from runs.models import Run
from tests.browser.conftest import login
from tests.runs.factory import claim, epochs, start


def seqs(rows: Any) -> list[int]:
    return [int(s) for s in rows.evaluate_all("els => els.map(e => e.dataset.seq)")]


def test_the_live_timeline_appends_new_rows_once_and_keeps_its_filter(
    new_page: Any, operator: User
) -> None:
    target = start()
    lease = claim()
    page = new_page()
    login(page, "olivia")
    page.goto(f"/runs/{target.id}/")
    timeline = page.locator(f"#run-{target.id}-timeline")
    rows = page.locator(f"#run-{target.id}-events > li")
    before = rows.count()
    page.wait_for_timeout(1000)  # the socket is open

    services.attempt_log(**epochs(lease), message="first pushed line")
    expect(timeline).to_contain_text("first pushed line")
    services.attempt_log(**epochs(lease), message="second pushed line")
    expect(rows).to_have_count(before + 2)
    assert seqs(rows) == sorted(set(seqs(rows)))
    assert seqs(rows)[-1] == Run.objects.get(pk=target.id).last_event_seq

    # A reply redraws the whole timeline; the next push appends only what it lacks.
    page.evaluate(
        f"htmx.ajax('GET', '/runs/{target.id}/timeline', "
        f"{{target: '#run-{target.id}-timeline', swap: 'outerHTML'}})"
    )
    page.wait_for_timeout(1000)
    services.attempt_log(**epochs(lease), message="third pushed line")
    expect(rows).to_have_count(before + 3)
    assert seqs(rows) == sorted(set(seqs(rows)))

    # Filtered ("failures": none yet): a push fetches it again with the filter.
    timeline.locator("nav.filters a.filter").nth(1).click()
    expect(timeline).to_have_attribute("data-filter", "failures")
    services.attempt_log(**epochs(lease), message="fourth pushed line")
    page.wait_for_timeout(2000)
    expect(timeline).to_have_attribute("data-filter", "failures")
    expect(timeline).not_to_contain_text("pushed line")
