"""The live dashboard in Chromium: pages follow runs without a reload.

The server is daphne in this process (``tests.live.server``). The first test runs the
agent in a ``runagents`` worker process, so its changes reach the browsers through
Redis, as in production; the others change runs through the services from this process.
Each page gets a marker at load; it is still there at the end, so no page was reloaded.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from playwright.sync_api import expect

import tests.live.agents  # noqa: F401 - registers live-ship here too
from runs import services
from runs.models import InputRequest, Run
from tests.browser.conftest import login, shot
from tests.dashboard.support import ask
from tests.live.agents import QUESTION
from tests.runs.factory import claim, epochs, start
from tests.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


def mark(page: Any) -> None:
    page.evaluate("() => { window.notReloaded = true; }")


def not_reloaded(page: Any) -> bool:
    return bool(page.evaluate("() => window.notReloaded === true"))


def status(page: Any, run_id: str) -> Any:
    return page.locator(f"#run-{run_id}-status")


def wait_until(page: Any, predicate: Any, timeout: float, what: str) -> None:
    """Poll while Playwright dispatches its events (a route handler runs only then)."""
    wait_for(predicate, timeout, what, sleep=lambda seconds: page.wait_for_timeout(seconds * 1000))


# --- A worker in another process, three people in three browsers --------------------------


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def worker(transactional_db: None, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``manage.py runagents`` in its own process, on the test database and Redis."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "HOLDPOINT_AGENT_MODULES": "tests.live.agents",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "WARNING",
    }
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runagents", "--agents", "live-ship", "--name", "live"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    log.close()


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.process
def test_a_worker_in_another_process_moves_every_open_page(
    new_page: Any,
    operator: User,
    approver: User,
    worker: subprocess.Popen[bytes],
    tmp_path: Path,
) -> None:
    """The operator watches the run page, a third user the inbox; the worker (another
    process) asks, the approver answers from a second browser, and every page follows."""
    third = User.objects.create_user("otto", password="pw-otto")
    third.groups.add(Group.objects.get(name="operator"))
    gate = str(tmp_path / "gate")
    run = services.run_start(agent="live-ship", input={"gate": gate}, user=operator)

    olivia = new_page()
    login(olivia, "olivia")
    olivia.goto(f"/runs/{run.id}/")
    otto = new_page()
    login(otto, "otto")  # lands on the inbox: nothing needs him yet
    expect(otto.locator("#inbox-list .request-card")).to_have_count(0)
    for page in (olivia, otto):
        mark(page)

    # The worker claims the run: the page says so without a reload.
    expect(status(olivia, run.id)).to_have_attribute("data-status", "running", timeout=20_000)

    # It asks: the run page shows the question, the third user's inbox gains the card.
    Path(gate + ".ask").touch()
    expect(status(olivia, run.id)).to_have_attribute("data-status", "input_required")
    req = InputRequest.objects.get(run=run)
    expect(olivia.locator(f"#request-{req.id} h2")).to_have_text(QUESTION)
    expect(otto.locator(f"#request-{req.id} h2")).to_have_text(QUESTION)
    expect(otto.locator("#inbox-count")).to_have_text("1")
    shot(olivia, "live-run-asks")

    # No worker may take the resumed run until the page has shown it queued.
    os.kill(worker.pid, signal.SIGSTOP)
    alice = new_page()
    login(alice, "alice")
    alice.locator(f"#request-{req.id}").get_by_role("button", name="ship").click()
    expect(alice.locator(f"#request-{req.id}")).to_contain_text("Answered by alice at")

    # The card leaves the third user's inbox at once; the run page shows it queued.
    expect(otto.locator(f"#request-{req.id}")).to_have_count(0)
    expect(otto.locator("#inbox-count")).to_have_text("0")
    expect(status(olivia, run.id)).to_have_attribute("data-status", "queued")
    expect(olivia.locator(f"#request-{req.id}")).to_contain_text("Answered by alice at")

    # The worker goes on: running again, in a second attempt, then done.
    os.kill(worker.pid, signal.SIGCONT)
    expect(status(olivia, run.id)).to_have_attribute("data-status", "running", timeout=10_000)
    expect(olivia.locator(f"#run-{run.id}-attempts tr[data-attempt='2']")).to_be_visible()
    Path(gate + ".finish").touch()
    expect(status(olivia, run.id)).to_have_attribute("data-status", "succeeded", timeout=10_000)
    expect(olivia.locator(f"#run-{run.id}-result")).to_contain_text("ship")
    shot(olivia, "live-run-succeeded")
    assert not_reloaded(olivia) and not_reloaded(otto)


# --- Expiry --------------------------------------------------------------------------------


def test_an_expired_request_disables_every_open_form_without_a_reload(
    new_page: Any, operator: User
) -> None:
    run, _lease, _cp, req = ask(expires_in=600)
    inbox = new_page()
    login(inbox, "olivia")
    run_page = new_page()
    login(run_page, "olivia")
    run_page.goto(f"/runs/{run.id}/")
    pages = (inbox, run_page)
    for page in pages:
        mark(page)
        expect(page.locator(f"#request-{req.id} button[type=submit]:enabled")).to_have_count(1)

    # The countdown ticks in the page.
    countdown = inbox.locator(f"#request-{req.id} .request-head time[data-countdown]")
    before = countdown.inner_text()
    expect(countdown).not_to_have_text(before, timeout=2500)

    # The person starts typing; then the sweep expires the request (its time is moved
    # back in the database: the pages' own countdowns still say ten minutes).
    inbox.locator(f"#request-{req.id} input:not([type=hidden])").first.fill("v9")
    InputRequest.objects.filter(pk=req.id).update(expires_at=req.created_at)
    assert services.requests_expire() == 1
    for page in pages:
        card = page.locator(f"#request-{req.id}")
        expect(card.locator("button[type=submit]:enabled")).to_have_count(0, timeout=1000)
        expect(card.locator(".chip")).to_contain_text(["Expired"])
        expect(card).to_contain_text("No response")
    expect(status(run_page, run.id)).to_have_attribute("data-status", "failed")
    shot(inbox, "live-expired-inbox")
    assert all(not_reloaded(page) for page in pages)


def test_a_report_fetch_overtaken_by_a_redraw_of_the_run_lands_in_the_new_column(
    new_page: Any, operator: User
) -> None:
    """The run page fetches its side-effect report after the page; a reply that redraws the
    run's main column (here: the cancel) comes before that fetch returns. The fetch's reply
    goes into the column that is there when it arrives, the report is fetched once more for
    the redrawn column, and the browser reports no problem (``new_page`` counts console
    errors such as htmx:oobErrorNoTarget, which an htmx request bound to the old column
    gave when its reply looked for the effects banner in the detached column)."""
    run, _lease, _cp, _req = ask(expires_in=600)
    held: list[Any] = []
    page = new_page()
    login(page, "olivia")
    page.route(
        re.compile(r".*/side-effects/runs/run_[0-9A-Z]+/\?origin=run$"),
        lambda route: held.append(route),
    )
    page.goto(f"/runs/{run.id}/")
    wait_until(page, lambda: len(held) == 1, 10, "the report's first fetch")

    page.locator("summary", has_text="Cancel run…").click()
    page.locator("#cancel-reason").fill("overtaken")
    page.get_by_role("button", name="Cancel this run").click()
    expect(status(page, run.id)).to_have_attribute("data-status", "cancelled")
    held[0].continue_()
    wait_until(page, lambda: len(held) == 2, 10, "the fetch for the redrawn column")
    held[1].continue_()
    expect(page.locator(f"#run-{run.id}-report")).to_contain_text("outside Holdpoint")
    expect(page.locator(f"#run-{run.id}-report")).to_have_count(1)


# --- Reconnecting ---------------------------------------------------------------------------


def test_a_page_that_loses_its_socket_catches_up_when_it_reconnects(
    new_page: Any, operator: User
) -> None:
    run = start()
    lease = claim()
    page = new_page()
    sockets: list[tuple[Any, Any]] = []

    def through(ws: Any) -> None:
        sockets.append((ws, ws.connect_to_server()))

    page.context.route_web_socket(re.compile(r".*/ws/runs/run_.*"), through)
    login(page, "olivia")
    page.goto(f"/runs/{run.id}/")
    mark(page)
    expect(status(page, run.id)).to_have_attribute("data-status", "running")
    wait_until(page, lambda: len(sockets) == 1, 5, "the page's socket")
    # htmx reconnects after a random delay under 1 s; make it 1.5 s, so the change below
    # surely happens while the page has no socket.
    page.evaluate("() => { htmx.config.wsReconnectDelay = () => 1500; }")

    browser_side, _server_side = sockets[0]
    browser_side.close(code=1012)  # "service restart": the page's socket drops (both sides)
    cp = services.checkpoint_save(**epochs(lease), step="ask", state={})
    services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="input_required",
        prompt="Asked while the page was offline",
        accepted_schema={"versions": "string[]"},
        expires_in=600,
    )
    assert Run.objects.get(pk=run.id).status == "input_required"
    expect(status(page, run.id)).to_have_attribute("data-status", "running")  # it missed it

    wait_until(page, lambda: len(sockets) == 2, 5, "the page to reconnect")
    expect(status(page, run.id)).to_have_attribute("data-status", "input_required")
    expect(page.locator(f"#run-{run.id}-pending")).to_contain_text(
        "Asked while the page was offline"
    )
    assert not_reloaded(page)
