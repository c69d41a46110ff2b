"""Issue 25, points 1 and 2 in the browser: the Workers page follows workers as they come,
work, fall silent and come back, without a reload; a queued run says why it is not
running (nobody serves its agent, its agent is paused by someone for a reason), on its
page and in the runs list, and says it anew when a worker or the gate changes."""

from __future__ import annotations

import datetime as dt
from typing import Any

import httpx
from django.contrib.auth.models import User
from django.db.models import F
from playwright.sync_api import expect

from runs import services
from runs.models import Worker
from runs.services.workers import forget_contacts
from runs.tokens import worker_token_create
from runs.workers import PROCESS, Identity
from tests.browser.conftest import login, shot, socket_open
from tests.runs.factory import AGENT, start

# Long enough for a loaded machine (2 cores at load 8): pushes go through a thread hop.
PUSHED = 20_000


def remote_claim(url: str, secret: str, name: str) -> int:
    """What a remote worker's claim sends over real HTTP: its identity in the headers."""
    response = httpx.post(
        f"{url}/api/worker/claim",
        json={"worker_id": f"{name}/1", "agents": [AGENT], "wait": 0},
        headers={
            "Authorization": f"Bearer {secret}",
            "Holdpoint-Worker-Name": name,
            "Holdpoint-Worker-Client": "holdpoint-client-typescript/0.1.0",
            "Holdpoint-Worker-Host": "edge-3",
            "Holdpoint-Worker-Pid": "777",
            "Holdpoint-Worker-Concurrency": "2",
            "Holdpoint-Worker-Agents": AGENT,
            "Holdpoint-Worker-Wait-Seconds": "20",
        },
        timeout=30,
    )
    return response.status_code


def silent_for(seconds: float) -> None:
    back = dt.timedelta(seconds=seconds)
    Worker.objects.update(
        last_seen_at=F("last_seen_at") - back,
        stale_at=F("stale_at") - back,
        gone_at=F("gone_at") - back,
    )


def test_the_workers_page_follows_a_worker_without_a_reload(
    page: Any, live_server: Any, operator: User
) -> None:
    _, secret = worker_token_create(name="edge")
    login(page, "olivia")
    page.get_by_role("link", name="Workers").click()
    expect(page.locator("h1")).to_have_text("Workers")
    expect(page.locator("#workers-live")).to_contain_text("No worker has called yet")
    socket_open(page)

    # A remote worker calls: it appears, alive, as it said it is.
    assert remote_claim(live_server.url, secret, "edge-worker-ts") == 204
    row = page.locator('tr[data-worker="edge-worker-ts"]')
    expect(row).to_have_attribute("data-state", "alive", timeout=PUSHED)
    expect(row).to_contain_text("holdpoint-client-typescript")
    expect(row).to_contain_text("edge-3")
    expect(row).to_contain_text("pid 777")
    expect(row).to_contain_text("idle")

    # It claims a run: the page says what it runs now.
    run = start()
    assert remote_claim(live_server.url, secret, "edge-worker-ts") == 200
    expect(row).to_contain_text(run.id, timeout=PUSHED)

    # It falls silent past its lease: the sweep says it is stale, and the page shows it.
    silent_for(75)
    services.workers_sweep()
    expect(row).to_have_attribute("data-state", "stale", timeout=PUSHED)
    expect(row.locator("[data-worker-state]")).to_have_text("Stale")
    shot(page, "workers-stale")

    # An in-process pool starts and stops: it comes, then it is gone.
    pool = Identity(name="host-b:42", principal=PROCESS, kind="process", agents=(AGENT,))
    services.worker_seen(identity=pool)
    pool_row = page.locator('tr[data-worker="host-b:42"]')
    expect(pool_row).to_have_attribute("data-state", "alive", timeout=PUSHED)
    expect(pool_row).to_contain_text("In process")
    services.worker_stopped(principal=PROCESS, name="host-b:42")
    expect(pool_row).to_have_attribute("data-state", "gone", timeout=PUSHED)
    shot(page, "workers")


def test_a_queued_run_says_why_it_waits_and_says_it_anew(
    new_page: Any, live_server: Any, operator: User
) -> None:
    run = start()
    page = new_page()
    login(page, "olivia")
    page.goto(f"/runs/{run.id}/")
    socket_open(page)
    waiting = page.locator(f"#run-{run.id}-waiting")
    expect(waiting).to_have_attribute("data-reason", "no_worker")
    expect(waiting).to_contain_text(f"No worker has served {AGENT} yet")

    # The agent is paused: the run is held, and says by whom and why (no reload).
    services.agent_pause(agent=AGENT, reason="INC-7 failover", user=operator)
    expect(waiting).to_have_attribute("data-reason", "agent_paused", timeout=PUSHED)
    expect(waiting).to_have_text("Held: agent paused by olivia, INC-7 failover")
    shot(page, "run-held-by-agent-pause")

    # A worker that serves it comes, and the agent is unpaused: it waits for a free one.
    forget_contacts()
    services.worker_seen(
        identity=Identity(name="host-c:9", principal=PROCESS, kind="process", agents=(AGENT,))
    )
    services.agent_unpause(agent=AGENT, user=operator)
    expect(waiting).to_have_attribute("data-reason", "ready", timeout=PUSHED)

    # The worker goes away: nobody serves the agent, since its last contact.
    services.worker_stopped(principal=PROCESS, name="host-c:9")
    expect(waiting).to_have_attribute("data-reason", "no_worker", timeout=PUSHED)
    expect(waiting).to_contain_text(f"No live worker serves {AGENT} since")
    expect(waiting).to_contain_text("(last: host-c:9)")

    # The runs list says the same, in the run's row.
    runs = new_page()
    login(runs, "olivia")
    runs.goto("/runs/")
    row = runs.locator(f"#run-{run.id}-row .run-waiting")
    expect(row).to_have_attribute("data-reason", "no_worker")
    socket_open(runs)
    services.agent_pause(agent=AGENT, reason="INC-8", user=operator)
    expect(row).to_have_attribute("data-reason", "agent_paused", timeout=PUSHED)
    expect(row).to_have_text("Held: agent paused by olivia, INC-8")
    shot(runs, "runs-list-held")
