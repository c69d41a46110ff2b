"""The MCP gateway in the browser: a real MCP client's gated call, through a real gateway
in front of a real downstream MCP server, is approved with an edit on the run's card in
Chromium, made once through a SIGKILL of the gateway (between the downstream call and its
outcome; the next gateway looks the key up), and the run's report shows it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import expect
from rest_framework.authtoken.models import Token

from ledger.models import SideEffect
from runs import services
from runs.models import InputRequest, Run
from runs.tokens import worker_token_create
from tests.browser.conftest import login, open_request, shot
from tests.mcp_support import Launcher, call, run_of, status_of, writes
from tests.waiting import wait_for

pytest.importorskip("mcp")

pytestmark = [pytest.mark.browser, pytest.mark.process, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def launch(live_server: Any, operator: User, tmp_path: Path) -> Iterator[Launcher]:
    files = tmp_path / "files"
    files.mkdir()
    _, token = worker_token_create(name="browser-mcp")
    api_token = Token.objects.create(user=operator).key
    launcher = Launcher(tmp_path, files, live_server.url, token, api_token, 3.0)
    yield launcher
    launcher.stop()


def settle(predicate: Any, what: str, timeout: float = 90) -> Any:
    def swept() -> Any:
        services.sweep_all()
        return predicate()

    return wait_for(swept, timeout, what, interval=0.2)


def test_a_gated_mcp_call_is_edited_in_the_browser_and_made_once_through_a_gateway_kill(
    new_page: Any, approver: User, launch: Launcher
) -> None:
    down = launch.downstream(slow_write=60)
    gw = launch.gateway(down)
    alice = new_page()
    login(alice, "alice")
    alice.goto("/")  # the inbox, open before the agent asks
    planned = {"path": "notes.txt", "text": "draft"}
    first = call(gw, "files__write_file", planned, "browser")
    assert status_of(first) == "pending", first
    run = run_of("browser")
    request = settle(
        lambda: InputRequest.objects.filter(run_id=run.id, status="pending").first(),
        "the approval",
    )
    # The gated call reaches the open inbox by the live push, without a reload.
    expect(alice.locator("main")).to_contain_text("write_file on files", timeout=30_000)

    alice.goto(f"/runs/{run.id}/")
    card = open_request(alice, request.id)
    expect(card.locator("h2")).to_have_text("write_file on files")
    expect(card).to_contain_text("files__write_file")
    card.get_by_text("Edit before approving").click()
    card.get_by_label("Text").fill("final")
    expect(card.locator("[data-edit-diff]")).to_contain_text("draft → final")
    shot(alice, "mcp-gateway-approval")
    card.get_by_role("button", name=re.compile("^Approve")).click()
    expect(alice.locator(f"#run-{run.id}-main .flash-success")).to_contain_text("Approved")

    # The next attempt makes the call; kill the gateway before its outcome comes back.
    wait_for(lambda: len(writes(launch.files)) == 1, 60, "the downstream write")
    gw.proc.kill()
    gw.proc.wait(10)
    launch.gateway(down)
    settle(lambda: Run.objects.get(pk=run.id).status == "succeeded", "the run to finish")
    [effect] = SideEffect.objects.filter(run_id=run.id)
    assert effect.status == "confirmed" and effect.request["text"] == "final"
    assert [w["text"] for w in writes(launch.files)] == ["final"]

    alice.goto(f"/side-effects/runs/{run.id}/")
    report = alice.locator("main")
    expect(report).to_contain_text("files__write_file")
    expect(report).to_contain_text("Cannot be undone")
    shot(alice, "mcp-gateway-report")
