"""Remote agents in the browser, for each kind of remote worker: the Python client, a
LangGraph graph through it, and the TypeScript client.

For each kind, a run started from the dashboard is answered in the browser (the Python and
TypeScript deploys: a question, then an approval; the LangGraph review: its interrupt as an
approval card), acts once through a SIGKILL of its worker, is finished by the next worker
and shows its report; the tool's executions log holds one execution. The Python and
TypeScript workers are killed after the act is recorded, while the step lingers; the
LangGraph worker inside the node, after the act and before its outcome is reported, and
the next worker looks the act up. For each kind, two looping runs started through the
services are one cancelled and one paused and continued from the browser (the LangGraph
cancel lands inside a node, which then does not act). The LangGraph review card is also
edited before approving and sent back with a comment.

The workers are real ``holdpoint-worker`` processes (Python and Node) talking HTTP to the
live server of the browser tests; expired leases are swept by the test, as a ``runagents``
sweeper would.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from playwright.sync_api import expect

from runs import services
from runs.models import InputRequest, Run, RunEvent
from runs.tokens import worker_token_create
from tests.browser.conftest import login, open_request, shot
from tests.waiting import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.process, pytest.mark.django_db(transaction=True)]

TS_CLIENT = Path(settings.BASE_DIR) / "clients" / "typescript"


@pytest.fixture
def tool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tool"
    path.mkdir()
    monkeypatch.setenv("HOLDPOINT_TEST_TOOL_DIR", str(path))
    return path


@pytest.fixture
def remote(live_server: Any, tool_dir: Path, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start a remote worker process: ``remote("py", name)`` or ``remote("ts", name)``."""
    _, token = worker_token_create(name="browser-remote")
    procs: list[subprocess.Popen[bytes]] = []

    def start(kind: str, name: str, **env: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"{name}.log"
        common = ["--url", live_server.url, "--lease-seconds", "3", "--wait", "2", "--grace", "1"]
        if kind == "py":
            command = [
                sys.executable,
                "-m",
                "holdpoint_client.cli",
                *common,
                "--name",
                name,
                "tests.clients.agents:AGENTS",
                "tests.clients.graphs:AGENTS",
            ]
            cwd = Path(settings.BASE_DIR)
        else:
            command = ["node", "dist/cli.js", *common, "--name", name, "./test/agents.mjs:AGENTS"]
            cwd = TS_CLIENT
        proc = subprocess.Popen(
            command,
            cwd=cwd,
            env={**os.environ, "HOLDPOINT_TOKEN": token, "PYTHONUNBUFFERED": "1", **env},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)

        def serving() -> bool:
            assert proc.poll() is None, log.read_text()
            return "serving" in log.read_text()

        wait_for(serving, 30, f"{name} to serve", interval=0.1)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(10)


def settle(predicate: Callable[[], Any], what: str, timeout: float = 40) -> Any:
    def swept() -> Any:
        services.sweep_all()
        return predicate()

    return wait_for(swept, timeout, what, interval=0.1)


def pending(run_id: str, kind: str) -> InputRequest:
    return settle(
        lambda: InputRequest.objects.filter(run_id=run_id, status="pending", kind=kind).first(),
        f"a {kind} request on {run_id}",
    )


def status_is(run_id: str, wanted: str) -> None:
    settle(lambda: Run.objects.get(pk=run_id).status == wanted, f"{run_id} to be {wanted}")


def executions(tool_dir: Path) -> list[str]:
    log = tool_dir / "executions.log"
    return log.read_text().splitlines() if log.exists() else []


def start_from_dashboard(page: Any, agent: str, fill: dict[str, str]) -> str:
    page.goto("/")
    page.get_by_role("link", name="Start a run").click()
    page.get_by_role("link", name=re.compile(agent)).click()
    for label, value in fill.items():
        page.get_by_label(re.compile(label, re.IGNORECASE)).first.fill(value)
    page.get_by_role("button", name=f"Start {agent}").click()
    expect(page.locator(".flash-success")).to_have_text("Run started.")
    return re.search(r"/runs/(run_[0-9A-Z]+)/", page.url).group(1)  # type: ignore[union-attr]


def answer_versions(page: Any, run_id: str, version: str) -> None:
    question = pending(run_id, "input_required")
    page.goto(f"/runs/{run_id}/")
    card = open_request(page, question.id)
    expect(card.locator("h2")).to_have_text("Which versions?")
    card.locator("input[name='answer/versions']").first.fill(version)
    card.get_by_role("button", name="Submit response").click()
    expect(page.locator(f"#run-{run_id}-main .flash-success")).to_contain_text("Answer sent.")


def approve(page: Any, run_id: str) -> None:
    approval = pending(run_id, "auth_required")
    page.goto(f"/runs/{run_id}/")
    card = open_request(page, approval.id)
    card.get_by_role("button", name=re.compile("^Approve")).click()
    expect(page.locator(f"#run-{run_id}-main .flash-success")).to_contain_text("Approved.")


def cancel_in_browser(page: Any, run_id: str) -> None:
    page.goto(f"/runs/{run_id}/")
    page.get_by_text("Cancel run…").click()
    page.get_by_label(re.compile("Reason")).fill("Wrong service")
    page.get_by_role("button", name="Cancel this run").click()
    expect(page.locator(f"#run-{run_id}-status")).to_have_text("Cancelled", timeout=20_000)


def pause_and_continue_in_browser(page: Any, run_id: str) -> None:
    """Pause a running run from its page, continue it there, and wait for it to succeed."""
    status_is(run_id, "running")
    page.goto(f"/runs/{run_id}/")
    page.get_by_text("Pause…").click()
    page.locator("#pause-reason").fill("Look first")
    page.get_by_role("button", name="Pause this run").click()
    expect(page.locator(f"#run-{run_id}-status")).to_have_text("Paused", timeout=20_000)
    page.locator(f"#run-{run_id}-paused").get_by_role("button", name="Continue").click()
    expect(page.locator(".flash-success")).to_contain_text("Run continued")
    status_is(run_id, "succeeded")


def test_a_python_client_run_end_to_end_through_a_worker_kill(
    new_page: Any, operator: User, approver: User, remote: Any, tool_dir: Path
) -> None:
    first = remote("py", "py-first", HOLDPOINT_TEST_LINGER="60")
    olivia = new_page()
    login(olivia, "olivia")
    run_id = start_from_dashboard(olivia, "remote-deploy", {"service": "auth-gateway"})
    answer_versions(olivia, run_id, "v2")
    alice = new_page()
    login(alice, "alice")
    approve(alice, run_id)
    # The side effect happens once; then the worker dies while the step lingers.
    settle(
        lambda: RunEvent.objects.filter(run_id=run_id, type="side_effect.confirmed").exists(),
        "the side effect",
    )
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    remote("py", "py-second")
    status_is(run_id, "succeeded")
    alice.goto(f"/runs/{run_id}/")
    expect(alice.locator(f"#run-{run_id}-status")).to_have_text("Succeeded")
    expect(alice.locator(f"#run-{run_id}-report")).to_contain_text("folder")
    shot(alice, "remote-python-succeeded")
    assert len(executions(tool_dir)) == 1


def test_a_python_client_run_is_cancelled_and_another_paused_from_the_browser(
    page: Any, operator: User, remote: Any
) -> None:
    remote("py", "py-loops")
    # Declared by the worker too, with its token: an owner of the agent.
    services.agent_declare(name="remote-loop", actor="test", owners=["browser-remote"])
    # Slow steps: the run page is re-rendered live at every checkpoint, and an open
    # dialog goes with it.
    cancelled = services.run_start(agent="remote-loop", input={"pause": 5}, user=operator).id
    paused = services.run_start(
        agent="remote-loop", input={"pause": 3, "steps": 2}, user=operator
    ).id
    login(page, "olivia")
    status_is(cancelled, "running")
    cancel_in_browser(page, cancelled)

    pause_and_continue_in_browser(page, paused)
    assert Run.objects.get(pk=paused).result == {"n": 2}


def test_a_langgraph_review_is_an_approval_card_edited_or_sent_back_in_the_browser(
    new_page: Any, operator: User, approver: User, remote: Any, tool_dir: Path
) -> None:
    pytest.importorskip("langgraph")
    remote("py", "py-graphs")
    olivia = new_page()
    login(olivia, "olivia")
    run_id = start_from_dashboard(olivia, "lg-review", {"request": "note"})
    review = pending(run_id, "auth_required")
    alice = new_page()
    login(alice, "alice")
    alice.goto(f"/runs/{run_id}/")
    card = open_request(alice, review.id)
    # The HumanInterrupt is the approval card: the tool call's arguments, editable.
    expect(card.locator("h2")).to_have_text("Run folder")
    expect(card.locator(".request-prompt")).to_contain_text("Run folder with")
    expect(card.get_by_role("table", name="Arguments")).not_to_contain_text(
        "editable"
    )  # Shown as the form only.
    card.get_by_text("Edit before approving").click()
    card.get_by_label("City").fill("nyc")
    expect(card.locator("[data-edit-diff]")).to_contain_text("sf → nyc")
    shot(alice, "remote-langgraph-review")
    card.get_by_role("button", name=re.compile("^Approve")).click()
    expect(alice.locator(f"#run-{run_id}-main .flash-success")).to_contain_text("Approved")
    status_is(run_id, "succeeded")
    # Approve with edits reached the graph as HumanResponse "edit" with the edited args.
    result = Run.objects.get(pk=run_id).result
    assert result["review"] == "edited"
    assert result["tool_call"]["args"] == {"city": "nyc", "note": "note"}
    assert len(executions(tool_dir)) == 1

    # "Send back with a comment" reaches the graph as HumanResponse "response".
    sent_back = start_from_dashboard(olivia, "lg-review", {"request": "other"})
    review = pending(sent_back, "auth_required")
    alice.goto(f"/runs/{sent_back}/")
    card = open_request(alice, review.id)
    card.get_by_role("button", name="Send back with a comment").click()
    expect(card).to_contain_text("Write what the agent should change")
    card.get_by_label("Comment").fill("Use the cache instead")
    card.get_by_role("button", name="Send back with a comment").click()
    expect(card).to_contain_text("Sent back by alice")
    status_is(sent_back, "succeeded")
    assert Run.objects.get(pk=sent_back).result["outcome"] == "Use the cache instead"
    assert len(executions(tool_dir)) == 1


def test_a_langgraph_run_killed_after_its_act_inside_a_node_acts_once(
    new_page: Any, operator: User, approver: User, remote: Any, tool_dir: Path
) -> None:
    pytest.importorskip("langgraph")
    (tool_dir / "hang-after-execute").touch()
    first = remote("py", "lg-first")
    olivia = new_page()
    login(olivia, "olivia")
    run_id = start_from_dashboard(olivia, "lg-review", {"request": "note"})
    alice = new_page()
    login(alice, "alice")
    approve(alice, run_id)
    # run_tool touched the world and hangs before saying so; its worker dies there.
    settle(lambda: (tool_dir / "hanging").exists(), "the act to hang")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    remote("py", "lg-second")
    status_is(run_id, "succeeded")
    alice.goto(f"/runs/{run_id}/")
    expect(alice.locator(f"#run-{run_id}-status")).to_have_text("Succeeded")
    expect(alice.locator(f"#run-{run_id}-report")).to_contain_text("folder")
    shot(alice, "remote-langgraph-succeeded")
    # The next worker ran the node again, looked the act up and did not repeat it.
    [execution] = executions(tool_dir)
    assert execution.split()[1] == str(first.pid)
    assert (tool_dir / "nodes.log").read_text().count("run_tool") == 2
    types = set(RunEvent.objects.filter(run_id=run_id).values_list("type", flat=True))
    assert {"side_effect.look_up", "side_effect.confirmed"} <= types
    assert Run.objects.get(pk=run_id).result["review"] == "accepted"


def test_a_langgraph_run_is_cancelled_and_another_paused_from_the_browser(
    page: Any, operator: User, remote: Any, tool_dir: Path
) -> None:
    pytest.importorskip("langgraph")
    remote("py", "lg-loops")
    # The first tick sleeps a minute inside the node: the cancel lands there.
    cancelled = services.run_start(
        agent="lg-loop", input={"steps": 5, "pause": 0.1, "hold_at": 0}, user=operator
    ).id
    paused = services.run_start(agent="lg-loop", input={"steps": 2, "pause": 3}, user=operator).id
    login(page, "olivia")
    status_is(cancelled, "running")
    nodes = tool_dir / "nodes.log"
    settle(lambda: nodes.exists() and "tick" in nodes.read_text(), "the first tick")
    cancel_in_browser(page, cancelled)

    pause_and_continue_in_browser(page, paused)
    assert Run.objects.get(pk=paused).result == {"steps": 2, "pause": 3, "n": 2}
    # The cancelled tick did not act; each of the other run's two ticks acted once.
    keys = [line.split()[0] for line in executions(tool_dir)]
    assert len(keys) == 2 and len(set(keys)) == 2


def require_ts_client() -> None:
    if shutil.which("node") is None or not (TS_CLIENT / "dist" / "cli.js").exists():
        if os.environ.get("CI") and shutil.which("npm"):
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TS_CLIENT, check=True)
            subprocess.run(["npm", "run", "build"], cwd=TS_CLIENT, check=True)
        else:
            pytest.skip("the TypeScript client is not built (npm ci && npm run build)")


def test_a_typescript_client_run_end_to_end_through_a_worker_kill(
    new_page: Any, operator: User, approver: User, remote: Any, tool_dir: Path
) -> None:
    require_ts_client()
    first = remote("ts", "ts-first", HOLDPOINT_TEST_LINGER="60")
    olivia = new_page()
    login(olivia, "olivia")
    run_id = start_from_dashboard(olivia, "ts-deploy", {"service": "billing"})
    answer_versions(olivia, run_id, "v9")
    alice = new_page()
    login(alice, "alice")
    approve(alice, run_id)
    # The side effect happens once; then the node worker dies while the step lingers.
    settle(
        lambda: RunEvent.objects.filter(run_id=run_id, type="side_effect.confirmed").exists(),
        "the side effect",
    )
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    remote("ts", "ts-second")
    status_is(run_id, "succeeded")
    alice.goto(f"/runs/{run_id}/")
    expect(alice.locator(f"#run-{run_id}-status")).to_have_text("Succeeded")
    expect(alice.locator(f"#run-{run_id}-report")).to_contain_text("folder")
    shot(alice, "remote-typescript-succeeded")
    # One execution, by the worker that was killed; the second one finished without acting.
    [execution] = executions(tool_dir)
    assert execution.split()[1] == str(first.pid)
    assert Run.objects.get(pk=run_id).result["deployed"] is True


def test_a_typescript_client_run_is_cancelled_and_another_paused_from_the_browser(
    page: Any, operator: User, remote: Any
) -> None:
    require_ts_client()
    remote("ts", "ts-loops")
    # Slow steps, as for the Python client: a checkpoint re-renders the run page.
    cancelled = services.run_start(agent="ts-loop", input={"pause": 5}, user=operator).id
    paused = services.run_start(agent="ts-loop", input={"pause": 3, "steps": 2}, user=operator).id
    login(page, "olivia")
    status_is(cancelled, "running")
    cancel_in_browser(page, cancelled)

    pause_and_continue_in_browser(page, paused)
    assert Run.objects.get(pk=paused).result == {"n": 2}
