"""A live Holdpoint server for the client tests: ``daphne config.asgi:application`` in its
own process, on a free port, against the test database (tests commit: ``transactional_db``).

The server runs no workers: the clients under test are the workers. Leases that ran out
are swept by the tests themselves (``services.sweep_all``), as a ``runagents`` sweeper or
``manage.py sweep`` would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connection
from holdpoint_client import Worker

from runs import services
from runs.models import InputRequest, Run
from runs.tokens import worker_token_create
from tests.live.server import free_port
from tests.waiting import wait_for


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@dataclass
class LiveServer:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(tmp: Path, port: int | None = None) -> LiveServer:
    port = port or free_port()
    log_path = tmp / f"server-{port}.log"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "PYTHONUNBUFFERED": "1",
        "HOLDPOINT_AGENT_MODULES": "",
        "LOG_LEVEL": "WARNING",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "config.asgi:application",
        ],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )
    server = LiveServer(f"http://127.0.0.1:{port}", proc, log_path)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {server.log()}")
        try:
            return httpx.get(server.url + "/healthz", timeout=1).status_code < 500
        except httpx.TransportError:
            return False

    wait_for(up, 30, "the live server")
    return server


def stop_server(server: LiveServer) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(10)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(10)


@pytest.fixture(scope="module")
def live_api(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    with django_db_blocker.unblock():
        assert connection.vendor == "postgresql", "the client tests need PostgreSQL"
        server = start_server(tmp_path_factory.mktemp("server"))
    yield server
    stop_server(server)


@pytest.fixture
def tool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "tool"
    path.mkdir()
    monkeypatch.setenv("HOLDPOINT_TEST_TOOL_DIR", str(path))
    return path


def executions(tool_dir: Path) -> list[str]:
    log = tool_dir / "executions.log"
    return log.read_text().splitlines() if log.exists() else []


LEASE = 3.0


def wait_until_the_server_is_idle(timeout: float = 15.0, quiet: float = 1.5) -> None:
    """Before the test's database is flushed: no other session of the live server has been
    in a transaction for ``quiet`` seconds (a request of a worker stopped a moment ago may
    still be running, and a long poll whose client left tries once more within a second;
    TRUNCATE beside either can deadlock and fail the flush)."""
    idle_since: float | None = None

    def quiet_long_enough() -> bool:
        nonlocal idle_since
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
                "AND state <> 'idle'"
            )
            (busy,) = cursor.fetchone()
        now = time.monotonic()
        if busy:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        return idle_since is not None and now - idle_since >= quiet

    # Past the budget the flush goes ahead anyway, as before: most waits end far sooner.
    wait_for(quiet_long_enough, timeout, "the live server to be idle", interval=0.1, give_up=True)


@pytest.fixture
def token() -> str:
    return worker_token_create(name="py-client")[1]


@pytest.fixture
def worker(live_api: LiveServer, token: str, tool_dir: Path) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(agents: Any = None, **kwargs: Any) -> Worker:
        from tests.clients.agents import AGENTS

        options = {"concurrency": 1, "lease_seconds": LEASE, "wait": 2.0, **kwargs}
        w = Worker(live_api.url, token, agents or AGENTS, **options).start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop(grace=2)
    wait_until_the_server_is_idle()


@pytest.fixture
def spawn(live_api: LiveServer, token: str, tool_dir: Path, tmp_path: Path):
    procs: list[subprocess.Popen[bytes]] = []

    def start(
        name: str, target: str = "tests.clients.agents:AGENTS", **env: str
    ) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"{name}.log"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "holdpoint_client.cli",
                "--url",
                live_api.url,
                "--lease-seconds",
                str(LEASE),
                "--wait",
                "2",
                "--grace",
                "1",
                "--name",
                name,
                target,
            ],
            cwd=settings.BASE_DIR,
            env={**os.environ, "HOLDPOINT_TOKEN": token, "PYTHONUNBUFFERED": "1", **env},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        wait_for(
            lambda: "serving" in log.read_text() or proc.poll() is not None, 30, f"{name} to start"
        )
        assert proc.poll() is None, log.read_text()
        return proc, log

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
    for proc in procs:
        proc.wait(10)
    wait_until_the_server_is_idle()


def status(run_id: str) -> str:
    return Run.objects.get(pk=run_id).status


def pending(run_id: str) -> InputRequest | None:
    return InputRequest.objects.filter(run_id=run_id, status="pending").first()


def wait_pending(run_id: str, kind: str, timeout: float = 20) -> InputRequest:
    def found() -> InputRequest | None:
        services.sweep_all()
        request = pending(run_id)
        return request if request is not None and request.kind == kind else None

    return wait_for(found, timeout, f"a pending {kind} request on {run_id} ({status(run_id)})")


def wait_status(run_id: str, *wanted: str, timeout: float = 30) -> str:
    def reached() -> str | None:
        services.sweep_all()
        now = status(run_id)
        return now if now in wanted else None

    return wait_for(reached, timeout, f"{run_id} to be {'/'.join(wanted)} (is {status(run_id)})")


def answer(run_id: str, request: InputRequest, value: Any, user: Any) -> None:
    services.run_resume(
        run_id=run_id,
        request_id=request.id,
        checkpoint_id=request.checkpoint_id,
        value=value,
        user=user,
    )
