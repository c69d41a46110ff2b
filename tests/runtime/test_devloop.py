"""Issue 19, point 3: the dev loop, with real processes on a throwaway SQLite database.

- a command run before ``migrate`` says "run `python manage.py migrate` first";
- on SQLite one process runs workers: a second one fails at start and says what to do,
  while ``serve --workers 0`` (the dashboard only) runs beside ``runagents``;
- ``runagents --reload`` restarts on a code change, releasing the leases first, and the
  next step runs the new code;
- it restarts for the agent modules and what they import, not for an author's tests and
  scripts beside them (issue 26).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.waiting import wait_for

pytestmark = pytest.mark.process

MANAGE = str(Path(settings.BASE_DIR) / "manage.py")

AGENT = """
from runtime.sdk import Agent

agent = Agent(name="dev-agent")
VERSION = {version}


@agent.step(start=True)
def work(ctx, state):
    for _ in range(int(ctx.input.get("laps", 0))):
        ctx.sleep(0.1)
    return ctx.next("finish", {{"worked_with": VERSION}})


@agent.step
def finish(ctx, state):
    return ctx.done({{"worked_with": state["worked_with"], "finished_with": VERSION}})
"""


@pytest.fixture
def sandbox(tmp_path: Path) -> dict[str, Any]:
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "devagent.py").write_text(AGENT.format(version=1))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        HOLDPOINT_VAR_DIR=str(tmp_path / "var"),
        HOLDPOINT_AGENT_MODULES="devagent",
        PYTHONPATH=os.pathsep.join([str(agents), str(settings.BASE_DIR)]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    return {"env": env, "agents": agents, "db": tmp_path / "var" / "holdpoint.sqlite3"}


def manage(sandbox: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, MANAGE, *args],
        env=sandbox["env"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def spawn(sandbox: dict[str, Any], tmp_path: Path) -> Iterator[Callable[..., Any]]:
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(*args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"proc-{len(started)}.log"
        proc = subprocess.Popen(
            [sys.executable, MANAGE, *args],
            env=sandbox["env"],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        started.append((proc, log))
        return proc, log

    yield start
    for proc, _ in started:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_row(db: Path, run_id: str) -> tuple[str, Any]:
    with sqlite3.connect(db) as conn:
        status, result = conn.execute(
            "SELECT status, result FROM runs_run WHERE id = ?", (run_id,)
        ).fetchone()
    return status, json.loads(result) if result else None


def test_commands_before_migrate_say_run_migrate_first(sandbox: dict[str, Any]) -> None:
    for args in (
        ("startrun", "dev-agent", "{}"),
        ("runagents",),
        ("watchrun", "run_x"),
        ("answerrun", "run_x", "{}"),
        ("sweep", "--once"),
        ("agent", "list"),
        ("serve", "--no-migrate", "--no-demo"),
    ):
        done = manage(sandbox, *args)
        assert done.returncode != 0, args
        assert "run `python manage.py migrate` first" in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr, (args, done.stderr)


def test_on_sqlite_one_process_runs_workers_and_the_dashboard_runs_beside_it(
    sandbox: dict[str, Any], spawn: Callable[..., Any]
) -> None:
    assert manage(sandbox, "migrate").returncode == 0
    first, first_log = spawn("runagents", "--concurrency", "2")
    wait_for(lambda: "runagents" in first_log.read_text(), 180, "the first runagents")
    second = manage(sandbox, "runagents")
    assert second.returncode != 0
    assert "Another process already runs workers on this SQLite database" in second.stderr
    assert "serve --workers 0" in second.stderr and "Traceback" not in second.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    web, web_log = spawn("serve", "--workers", "0", "--no-demo", "--port", str(port))
    wait_for(lambda: "Holdpoint is running" in web_log.read_text(), 180, "serve --workers 0")
    assert "no workers: run `python manage.py runagents --reload` beside it" in web_log.read_text()
    # The banner is printed before daphne listens: wait for the port, then ask.
    wait_for(lambda: "Listening on TCP address" in web_log.read_text(), 180, "the web port")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as reply:
        assert reply.status == 200
    # The workers of the other process run what the CLI starts.
    run_id = manage(sandbox, "startrun", "dev-agent", "{}").stdout.strip()
    assert wait_for(lambda: run_row(sandbox["db"], run_id)[0] == "succeeded", 180, "the run")
    assert first.poll() is None and web.poll() is None


def test_runagents_reload_restarts_on_a_code_change_and_releases_leases_first(
    sandbox: dict[str, Any], spawn: Callable[..., Any]
) -> None:
    assert manage(sandbox, "migrate").returncode == 0
    proc, log = spawn(
        "runagents",
        "--reload",
        "--concurrency",
        "2",
        "--reload-interval",
        "0.2",
        "--grace-seconds",
        "1",
        "--lease-seconds",
        "60",
    )
    wait_for(lambda: "workers for" in log.read_text(), 180, "the first child")
    done = manage(sandbox, "startrun", "dev-agent", "{}").stdout.strip()
    wait_for(lambda: run_row(sandbox["db"], done)[0] == "succeeded", 180, "the first run")
    assert run_row(sandbox["db"], done)[1] == {"worked_with": 1, "finished_with": 1}

    # A run in the middle of a long step when the code changes.
    busy = manage(sandbox, "startrun", "dev-agent", '{"laps": 600}').stdout.strip()
    wait_for(lambda: run_row(sandbox["db"], busy)[0] == "running", 180, "the long step")
    time.sleep(0.5)
    (sandbox["agents"] / "devagent.py").write_text(AGENT.format(version=2))
    wait_for(lambda: "changed; restarting" in log.read_text(), 30, "the restart")
    # Released at shutdown (not left to run out: the lease is 60 s), then taken over by the
    # new child, which runs the step again from its checkpoint with the new code.
    with sqlite3.connect(sandbox["db"]) as conn:
        wait_for(
            lambda: conn.execute(
                "SELECT count(*) FROM runs_attempt WHERE run_id = ? AND number = 2", (busy,)
            ).fetchone()[0],
            30,
            "a second attempt",
        )
        first = conn.execute(
            "SELECT status, error_message FROM runs_attempt WHERE run_id = ? AND number = 1",
            (busy,),
        ).fetchone()
    assert first == ("aborted", "released: shutdown")
    assert proc.poll() is None
    later = manage(sandbox, "startrun", "dev-agent", "{}").stdout.strip()
    wait_for(lambda: run_row(sandbox["db"], later)[0] == "succeeded", 180, "a run after the change")
    assert run_row(sandbox["db"], later)[1] == {"worked_with": 2, "finished_with": 2}
    proc.terminate()
    proc.wait(30)
    assert "stopped after" in log.read_text()


def test_runagents_reload_watches_what_the_agent_imports_not_the_tests_beside_it(
    sandbox: dict[str, Any], spawn: Callable[..., Any]
) -> None:
    """Issue 26: an author's tests and scripts next to the agent do not restart the workers;
    the agent module and a module it imports do."""
    agents = sandbox["agents"]
    (agents / "devhelper.py").write_text("GREETING = 'hello'\n")
    (agents / "devagent.py").write_text(
        "import devhelper  # noqa: F401\n" + AGENT.format(version=1)
    )
    (agents / "tests").mkdir()
    (agents / "tests" / "test_devagent.py").write_text("def test_it():\n    pass\n")
    (agents / "scripts").mkdir()
    (agents / "scripts" / "seed.py").write_text("print('seed')\n")
    (agents / "unused.py").write_text("X = 1\n")
    assert manage(sandbox, "migrate").returncode == 0
    proc, log = spawn("runagents", "--reload", "--reload-interval", "0.2", "--grace-seconds", "1")
    wait_for(lambda: "workers for" in log.read_text(), 180, "the first child")

    def restarts() -> list[str]:
        return [line for line in log.read_text().splitlines() if "changed; restarting" in line]

    # What the author edits beside the agent: their test, a script, a module nothing imports.
    for path in ("tests/test_devagent.py", "scripts/seed.py", "unused.py"):
        (agents / path).write_text((agents / path).read_text() + "# edited\n")
    # Then a module the agent imports. Had any of the above been watched, its restart would
    # come first or be named in the same line as this one.
    (agents / "devhelper.py").write_text("GREETING = 'hello again'\n")
    wait_for(restarts, 60, "the restart for devhelper.py")
    assert restarts()[0].count(str(agents)) == 1 and "devhelper.py" in restarts()[0], restarts()
    wait_for(lambda: log.read_text().count("workers for") == 2, 180, "the second child")
    (agents / "devagent.py").write_text(
        "import devhelper  # noqa: F401\n" + AGENT.format(version=2)
    )
    wait_for(lambda: len(restarts()) == 2, 60, "the restart for devagent.py")
    assert "devagent.py" in restarts()[1] and restarts()[1].count(str(agents)) == 1, restarts()
    assert proc.poll() is None
