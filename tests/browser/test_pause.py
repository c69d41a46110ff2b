"""Pause in the browser: pause and continue a run, the agent gate, a stale Continue."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import User
from playwright.sync_api import expect

from runs import services
from runs.models import AgentGate, Run
from tests.browser.conftest import login, shot
from tests.runs.factory import AGENT, claim, epochs, start


def paused_at_boundary(run: Run, lease: Any) -> str:
    """What the worker does at its next boundary once told: save the checkpoint, release."""
    assert services.attempt_heartbeat(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch
    ).pause_requested
    cp = services.checkpoint_save(**epochs(lease), step="publish", state={"n": 1})
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="paused"
    )
    return cp.id


def test_it_pauses_a_running_run_and_continues_it(page: Any, operator: User) -> None:
    run = start()
    lease = claim(lease_seconds=60)
    login(page, "olivia")
    page.goto(f"/runs/{run.id}/")
    expect(page.locator(f"#run-{run.id}-status")).to_have_text("Running")
    page.get_by_text("Pause…").click()
    page.locator("#pause-reason").fill("Check the diff before publishing")
    shot(page, "pause-dialog")
    page.get_by_role("button", name="Pause this run").click()
    expect(page.locator(f"#run-{run.id}-status")).to_have_text("Pausing…")
    expect(page.locator(".flash-success")).to_contain_text("Pause accepted")
    paused_at_boundary(run, lease)
    # No reload: the page shows the run paused, who paused it, why and before which step.
    expect(page.locator(f"#run-{run.id}-status")).to_have_text("Paused")
    panel = page.locator(f"#run-{run.id}-paused")
    expect(panel).to_contain_text("by olivia since")
    expect(panel).to_contain_text("before step publish")
    expect(panel).to_contain_text("Check the diff before publishing")
    shot(page, "run-paused")
    panel.get_by_role("button", name="Continue").click()
    expect(page.locator(".flash-success")).to_contain_text("Run continued")
    expect(page.locator(f"#run-{run.id}-status")).to_have_text("Queued")
    run.refresh_from_db()
    assert run.status == "queued" and run.current_attempt.reason == "resume"


def test_a_stale_tab_cannot_continue_a_run_that_was_continued_and_paused_again(
    new_page: Any, operator: User
) -> None:
    run = start()
    services.run_pause(run_id=run.id, reason="first look", actor="user:olivia")
    first, second = new_page(), new_page()
    # The second tab is stale: its live socket is down (pushes would update it at once).
    second.context.route_web_socket(re.compile(r".*/ws/.*"), lambda ws: None)
    login(first, "olivia")
    login(second, "olivia")
    first.goto(f"/runs/{run.id}/")
    second.goto(f"/runs/{run.id}/")
    first.locator(f"#run-{run.id}-paused").get_by_role("button", name="Continue").click()
    expect(first.locator(".flash-success")).to_contain_text("Run continued")
    services.run_pause(run_id=run.id, reason="second look", actor="user:olivia")
    second.locator(f"#run-{run.id}-paused").get_by_role("button", name="Continue").click()
    expect(second.locator(".flash-error")).to_contain_text("This pause is out of date")
    # The refreshed panel shows the new pause, which can be continued.
    expect(second.locator(f"#run-{run.id}-paused")).to_contain_text("second look")
    run.refresh_from_db()
    assert run.status == "paused"
    assert run.events.filter(type="run.continued").count() == 1
    shot(second, "stale-continue")


def test_it_pauses_and_unpauses_an_agent_from_the_agents_page(page: Any, operator: User) -> None:
    running = start()
    lease = claim(lease_seconds=60)
    start()
    login(page, "olivia")
    page.goto("/agents/")
    row = page.locator(f"#agent-{AGENT}")
    expect(row.locator("[data-gate]")).to_have_text("Open")
    row.get_by_role("link", name="Pause…").click()
    expect(page.locator("#pause-confirm-text")).to_have_text(
        "1 running attempts will stop at their next step; 1 queued runs will wait."
    )
    page.locator("#gate-reason").fill("Model misbehaves (INC-7)")
    shot(page, "agent-pause-confirm")
    page.get_by_role("button", name=f"Pause {AGENT}").click()
    expect(page.locator(".flash-success")).to_contain_text(f"Agent {AGENT} paused")
    expect(row.locator("[data-gate]")).to_have_text("Paused")
    expect(row).to_contain_text("Model misbehaves (INC-7)")
    assert AgentGate.objects.get(pk=AGENT).paused
    assert services.attempt_claim(worker_id="w") is None
    # The running attempt stops at its boundary; the page shows it live (held, queued).
    cp = services.checkpoint_save(**epochs(lease), step="two", state={})
    assert cp.pause_requested
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="paused"
    )
    expect(row).to_contain_text("Holds 2 runs")
    shot(page, "agent-paused")
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Unpause").click()
    expect(row.locator("[data-gate]")).to_have_text("Open")
    assert not AgentGate.objects.get(pk=AGENT).paused
    lease = services.attempt_claim(worker_id="w")
    assert lease is not None
    running.refresh_from_db()
