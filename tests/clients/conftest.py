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

from tests.live.server import free_port


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


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


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
