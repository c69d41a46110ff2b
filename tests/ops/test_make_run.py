"""``make run``'s server command on a fresh machine: a newcomer logs in and sees every demo state.

Starts ``manage.py serve`` (what ``make run`` runs) in a subprocess on a free port
with a fresh data folder and no DATABASE_URL/REDIS_URL (the zero-setup mode), logs in
with Chromium and finds each seeded demo state; then stops it with Ctrl-C and checks
that a second start keeps the data and seeds nothing twice.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "demo-pass-for-tests"
# (agent, status) of each seeded demo run, and what it demonstrates.
EXPECTED = {
    ("auth-token-migration", "input_required"): "a question waiting for an answer",
    ("auth-token-migration", "auth_required"): "an approval before a risky config change",
    ("nightly-report", "waiting"): "a run backing off after a transient error",
    ("flaky-deploy", "failed"): "a run stopped on a repeated error",
    ("webhook-fanout", "failed"): "a run with an unknown side effect",
    ("auth-token-migration", "succeeded"): "a finished run with its report",
}

pytestmark = [pytest.mark.process, pytest.mark.browser]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    def __init__(self, var: Path) -> None:
        self.port = free_port()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}
        }
        env.update(
            HOLDPOINT_VAR_DIR=str(var),
            HOLDPOINT_DEMO_PASSWORD=PASSWORD,
            HOLDPOINT_WEBHOOK_TIMEOUT_SECONDS="2",
            PYTHONUNBUFFERED="1",
        )
        self.log = (var / f"serve-{self.port}.log").open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "serve",
                "--port",
                str(self.port),
                "--receiver-port",
                "0",
                "--workers",
                "3",
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            # Its own process group: a serve that must be killed takes its remote demo
            # workers with it (they would retry their server for ever).
            start_new_session=True,
            # Ctrl-C as at a terminal: a suite started in the background by a shell without
            # job control inherits SIGINT ignored, and serve would never hear it.
            preexec_fn=_default_sigint,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        path = Path(self.log.name)
        while time.monotonic() < deadline:
            text = path.read_text()
            if "Holdpoint is running" in text and "Listening on TCP" in text:
                return text
            assert self.process.poll() is None, text
            time.sleep(0.2)
        raise AssertionError("serve did not start:\n" + path.read_text())

    def stop(self) -> str:
        self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise AssertionError(
                "serve did not stop within 60 s of Ctrl-C:\n" + Path(self.log.name).read_text()
            ) from None
        assert code == 0, Path(self.log.name).read_text()
        self.log.close()
        return Path(self.log.name).read_text()


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def remote_agents(var: Path, timeout: float = 30) -> set[str]:
    from sqlite3 import connect

    deadline = time.monotonic() + timeout
    names: set[str] = set()
    while time.monotonic() < deadline:
        with connect(var / "holdpoint.sqlite3") as db:
            names = {name for (name,) in db.execute("SELECT name FROM runs_declaredagent")}
        if {"remote-triage", "remote-review"} <= names:
            break
        time.sleep(0.5)
    return names


def seen_states(page: Any, base: str) -> set[tuple[str, str]]:
    page.goto(f"{base}/runs/")
    rows = page.locator("tr[id$='-row']")
    states = set()
    for i in range(rows.count()):
        cells = rows.nth(i).locator("td")
        agent = cells.nth(1).inner_text().strip()
        status = cells.nth(2).locator("[data-status]").get_attribute("data-status")
        states.add((agent, status))
    return states


def test_make_run_serves_the_demo_and_keeps_it_across_a_restart(
    tmp_path: Path, browser: Any
) -> None:
    server = Server(tmp_path)
    try:
        banner = server.wait_ready()
        assert f"operator  {PASSWORD}" in banner and "approver" in banner and "viewer" in banner
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{server.url}/login/")
        page.fill("input[name=username]", "operator")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(re.compile(r"^(?!.*login).*$"))
        deadline = time.monotonic() + 90
        states: set[tuple[str, str]] = set()
        while time.monotonic() < deadline:
            states = seen_states(page, server.url)
            if set(EXPECTED) <= states:
                break
            time.sleep(1)
        missing = {v for k, v in EXPECTED.items() if k not in states}
        assert not missing, f"not shown: {missing}; seen {states}"
        # One remote agent of each kind declared itself over the worker API (the
        # TypeScript one when Node is here and the client is built).
        assert "remote demo workers" in banner
        declared = remote_agents(tmp_path)
        assert {"remote-triage", "remote-review"} <= declared, declared
        if "typescript" in banner.split("remote demo workers", 1)[1].splitlines()[0]:
            assert "ts-incident" in declared
        page.goto(f"{server.url}/agents/")
        assert "remote-triage" in page.content()
        page.goto(f"{server.url}/side-effects/")
        assert "analytics" in page.content()  # the webhook whose outcome is unknown
        # Issue 18: a config change two people must approve, the first approval given,
        # editable before approving.
        page.goto(f"{server.url}/?tab=all")
        team = page.locator("[data-team]").filter(has_text="1 of 2 approvals: approver")
        assert team.count() >= 1, "no approval showing 1 of 2 approvals"
        assert page.locator("[data-edit-args]").count() >= 1
        shots = ROOT / "test-output" / "screenshots"
        shots.mkdir(parents=True, exist_ok=True)
        page.goto(f"{server.url}/runs/")
        page.screenshot(path=str(shots / "make-run-runs.png"), full_page=True)
        context.close()
        # The people who may answer are told by e-mail (the console mail backend) when the
        # sweeper next sends the outbox: wait for it rather than for luck.
        log = Path(server.log.name)
        deadline = time.monotonic() + 120
        while "Subject: [Holdpoint]" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        output = server.stop()
    assert "stopped; leases released" in output
    # The people who may answer were told by e-mail (the console mail backend).
    assert "Subject: [Holdpoint]" in output and "To: " in output

    again = Server(tmp_path)
    try:
        banner = again.wait_ready()
        assert PASSWORD not in banner  # the password is shown once, at first start
    finally:
        again.stop()
    from sqlite3 import connect

    with connect(tmp_path / "holdpoint.sqlite3") as db:
        (runs,) = db.execute("SELECT count(*) FROM runs_run").fetchone()
    assert runs == len(EXPECTED)  # kept, and not seeded twice
