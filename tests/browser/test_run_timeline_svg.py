"""Issue 30: the run drawn on a time axis, in Chromium. A run with two attempts, a hold
point, an unknown side effect and a pause: the marks are where the events say, focusing
one shows its event, a click brings its row in the list into view, a new event appears
without a reload, and on a phone the drawing scrolls inside its box, never the page."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import User
from playwright.sync_api import expect

from runs import services
from runs.models import InputRequest
from tests.browser.conftest import SCREENSHOTS, login, shot, socket_open
from tests.dashboard.chart_scenario import effect, two_attempts_hold_pause_unknown
from tests.runs.factory import claim


def drawn(page: Any, svg: str) -> dict[str, list[dict[str, Any]]]:
    """Where each thing is drawn, in the drawing's own coordinates, read in one go."""
    return page.evaluate(
        """(svg) => {
          const root = document.querySelector(svg);
          const origin = root.getBoundingClientRect();
          const of = (el) => {
            const r = el.getBoundingClientRect();
            return {x: r.x - origin.x, y: r.y - origin.y, width: r.width, height: r.height};
          };
          const items = (selector) => [...root.querySelectorAll(selector)].map((a) => ({
            ...of(a.querySelector("rect")), lane: a.dataset.lane, outcome: a.dataset.outcome,
          }));
          return {
            lanes: [...root.querySelectorAll(".tl-lane-bg")].map(of),
            steps: items(".tl-step"), holds: items(".tl-hold"), pauses: items(".tl-pause"),
            marks: items(".tl-mark"),
          };
        }""",
        svg,
    )


def right(b: dict[str, float]) -> float:
    return b["x"] + b["width"]


def inside_band(item: dict[str, float], band: dict[str, float]) -> bool:
    return (
        band["y"] - 0.5 <= item["y"]
        and item["y"] + item["height"] <= band["y"] + band["height"] + 0.5
    )


def test_the_timeline_draws_the_run_where_its_events_say_and_follows_it_live(
    new_page: Any, operator: User, approver: User
) -> None:
    # Scenes 0.3 s apart: each is wide enough on the axis to be told apart.
    scene = two_attempts_hold_pause_unknown(answerer=approver, pauser=operator, gap=0.3)
    run_id = scene.run.id
    page = new_page()
    login(page, "olivia")
    page.goto(f"/runs/{run_id}/")
    chart = page.locator(f"#run-{run_id}-chart")
    expect(chart.locator(".tl-lane")).to_have_count(2)
    page.wait_for_load_state("networkidle")
    at = drawn(page, f"#run-{run_id}-chart svg")
    band1, band2 = at["lanes"]
    assert band1["y"] < band2["y"]
    bars1 = [b for b in at["steps"] if b["lane"] == "0"]
    bars2 = [b for b in at["steps"] if b["lane"] == "1"]
    assert bars1 and bars2
    assert all(inside_band(b, band1) for b in bars1), (band1, bars1)
    assert all(inside_band(b, band2) for b in bars2), (band2, bars2)

    # The hold point: a gap after attempt 1's last step and before attempt 2's first,
    # labelled with who answered.
    hold = chart.locator(".tl-hold")
    expect(hold).to_have_attribute("aria-label", re.compile(r"Answered by .*alice.* after"))
    (held,) = at["holds"]
    assert inside_band(held, band1)
    assert max(right(b) for b in bars1) <= held["x"] + 0.5
    assert right(held) <= min(b["x"] for b in bars2) + 0.5

    # The unknown side effect: a mark in attempt 2's lane, with the unknown pattern, while
    # attempt 2 ran and before the pause.
    unknown = chart.locator('.tl-mark[data-outcome="unknown"]')
    expect(unknown.locator("rect")).to_have_attribute("fill", "url(#tl-p-unknown)")
    (marked,) = [m for m in at["marks"] if m["outcome"] == "unknown"]
    assert marked["lane"] == "1"
    assert band2["y"] <= marked["y"] + marked["height"] / 2 <= band2["y"] + band2["height"]
    (pause,) = at["pauses"]
    assert inside_band(pause, band2)
    assert min(b["x"] for b in bars2) <= marked["x"] and right(marked) <= pause["x"] + 0.5
    (confirmed,) = [m for m in at["marks"] if m["outcome"] == "confirmed"]
    assert band1["y"] <= confirmed["y"] + confirmed["height"] / 2 <= band1["y"] + band1["height"]
    assert right(confirmed) <= held["x"]

    # Focus shows the event; a click brings its row in the list into view.
    seq = unknown.get_attribute("data-seq")
    detail = chart.locator(".chart-detail")
    unknown.focus()
    expect(detail).to_contain_text(f"#{seq}")
    expect(detail).to_contain_text("Side effect outcome unknown")
    row = page.locator(f"#run-{run_id}-event-{seq}")
    page.evaluate("window.scrollTo(0, 0)")
    unknown.click()
    page.wait_for_url(re.compile(rf"#run-{run_id}-event-{seq}$"))
    expect(row).to_be_in_viewport()
    page.evaluate("window.scrollTo(0, 0)")
    shot(page, "run-timeline-desktop")
    # The drawing alone: docs/img/run-timeline.png is a copy of it.
    chart.screenshot(path=str(SCREENSHOTS / "run-timeline-chart.png"))

    # Live: the pause is continued and a third attempt records a failed effect; the
    # drawing follows without a reload.
    socket_open(page)
    page.evaluate("window.__notReloaded = true")
    pause_request = InputRequest.objects.get(pk=scene.run.pending_request_id)
    services.run_resume(
        run_id=run_id,
        request_id=pause_request.id,
        checkpoint_id=pause_request.checkpoint_id,
        user=operator,
    )
    third = claim()
    effect(third, step="notify", tool="webhook", target="third-hook", status="failed")
    expect(chart.locator(".tl-lane")).to_have_count(3)
    failed = chart.locator('.tl-mark[data-outcome="failed"]')
    expect(failed).to_have_count(1)
    expect(failed).to_have_attribute("data-lane", "2")
    expect(chart.locator(".tl-pause")).to_have_attribute("aria-label", re.compile("Continued by"))
    assert page.evaluate("window.__notReloaded") is True

    # A phone: the page does not scroll sideways; the drawing's box does.
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths
    scroller = chart.locator(".chart-box")
    inner = scroller.evaluate("el => [el.scrollWidth, el.clientWidth]")
    assert inner[0] > inner[1], inner
    scroller.evaluate("el => { el.scrollLeft = 400; }")
    assert scroller.evaluate("el => el.scrollLeft") > 0
    assert page.evaluate("window.scrollX") == 0
    scroller.evaluate("el => { el.scrollLeft = 0; }")
    shot(page, "run-timeline-phone")
