"""The OpenAI Agents SDK demo (``holdpoint_client.demo_openai_agents``, ``make run``'s
``remote-status``) answered from the inbox: a run started from the dashboard stops at its
tool with ``needs_approval``; its worker is SIGKILLed while the run waits there, between
turns; the approval card in the inbox is edited and approved; the next worker resumes from
the SDK's ``RunState`` in the checkpoint, posts the status once to the demo receiver with
the edited text, and the run succeeds with the model's answer, no earlier turn redone. A
second run is sent back with a comment, which the model reads.

The worker is a real ``holdpoint-worker`` process on the scripted model (no provider, no
network but the demo receiver on this machine); expired leases are swept by the test.
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
from django.conf import settings
from django.contrib.auth.models import User
from playwright.sync_api import expect

from runs.models import Checkpoint, Run
from runs.tokens import worker_token_create
from runtime.demo_receiver import DemoReceiver
from tests.browser.conftest import login, open_request, shot
from tests.browser.test_remote_agents import pending, start_from_dashboard, status_is
from tests.waiting import wait_for

pytest.importorskip("agents")

pytestmark = [pytest.mark.browser, pytest.mark.process, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def receiver() -> Iterator[DemoReceiver]:
    with DemoReceiver() as r:
        yield r


@pytest.fixture
def demo_worker(live_server: Any, receiver: DemoReceiver, tmp_path: Path) -> Iterator[Any]:
    """Start a worker process for the demo: ``demo_worker(name)``."""
    _, token = worker_token_create(name="browser-openai-agents")
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"{name}.log"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "holdpoint_client.cli",
                "--url",
                live_server.url,
                "--lease-seconds",
                "3",
                "--wait",
                "2",
                "--grace",
                "1",
                "--name",
                name,
                "holdpoint_client.demo_openai_agents:AGENTS",
            ],
            cwd=Path(settings.BASE_DIR),
            env={
                **os.environ,
                "HOLDPOINT_TOKEN": token,
                "HOLDPOINT_DEMO_RECEIVER": receiver.url,
                "PYTHONUNBUFFERED": "1",
            },
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)

        def serving() -> bool:
            assert proc.poll() is None, log.read_text()
            return "serving" in log.read_text()

        wait_for(serving, 30, "the demo worker to serve", interval=0.1)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)


def test_the_openai_agents_demo_is_answered_from_the_inbox(
    new_page: Any,
    operator: User,
    approver: User,
    demo_worker: Any,
    receiver: DemoReceiver,
) -> None:
    first = demo_worker("oa-demo-first")
    olivia = new_page()
    login(olivia, "olivia")
    run_id = start_from_dashboard(olivia, "remote-status", {"incident": "INC-7"})
    approval = pending(run_id, "auth_required")
    # The worker dies between turns (the run waits at its interrupted turn); the next one
    # resumes from the SDK's RunState in the checkpoint, in a fresh process.
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    demo_worker("oa-demo-second")
    # The model's first turn (a read) is behind a checkpoint; the interrupted turn is saved
    # before anyone is asked.
    steps = list(
        Checkpoint.objects.filter(run_id=run_id).order_by("number").values_list("step", flat=True)
    )
    assert steps == ["turn", "turn", "review"]

    alice = new_page()
    login(alice, "alice")
    alice.goto("/")
    card = open_request(alice, approval.id)
    expect(card.locator(".request-prompt")).to_contain_text("Approve post_status(")
    card.get_by_text("Edit before approving").click()
    card.get_by_label("Text").fill("Resolved: INC-7 is fixed.")
    expect(card.locator("[data-edit-diff]")).to_contain_text("INC-7 is fixed.")
    shot(alice, "remote-openai-agents-review")
    card.get_by_role("button", name=re.compile("^Approve")).click()
    expect(alice.locator(".flash-success").first).to_contain_text("Approved")
    status_is(run_id, "succeeded")

    # The tool ran once, with the edited text, through the ledger; the model read its output.
    [delivery] = receiver.book.deliveries.values()
    assert "Resolved: INC-7 is fixed." in str(delivery)
    result = Run.objects.get(pk=run_id).result
    assert result["agent"] == "status-writer"
    # No turn before the kill ran again: one checkpoint per turn, the last by the new worker.
    steps = list(
        Checkpoint.objects.filter(run_id=run_id).order_by("number").values_list("step", flat=True)
    )
    assert steps == ["turn", "turn", "review", "turn"]
    assert result["output"].startswith("Status update for INC-7: Posted to #status")
    alice.goto(f"/runs/{run_id}/")
    expect(alice.locator(f"#run-{run_id}-status")).to_have_text("Succeeded")
    expect(alice.locator(f"#run-{run_id}-report")).to_contain_text("status-page")

    # Send back with a comment: the SDK rejects the call with the comment as its message,
    # and the model goes on with it; nothing is posted.
    sent_back = start_from_dashboard(olivia, "remote-status", {"incident": "INC-8"})
    approval = pending(sent_back, "auth_required")
    alice.goto("/")
    card = open_request(alice, approval.id)
    card.get_by_label(re.compile("^Comment")).fill("Wait for the postmortem")
    card.get_by_role("button", name="Send back with a comment").click()
    status_is(sent_back, "succeeded")
    approval.refresh_from_db()
    assert approval.answer["decision"] == "respond"
    assert Run.objects.get(pk=sent_back).result["output"] == (
        "Status update for INC-8: Wait for the postmortem"
    )
    assert len(receiver.book.deliveries) == 1
