"""``holdpoint-worker``'s command line, of both clients: ``--help`` prints the usage and
exits 0; a mistake (an unknown option, a missing ``--url``, a bad number) prints the usage
and exits 2, never a stack trace (the TypeScript CLI's ``--help`` crashed with one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.clients.node import CLIENT, build

pytestmark = pytest.mark.process

CLIENTS = ["python", "typescript"]


def holdpoint_worker(client: str, *args: str) -> subprocess.CompletedProcess[str]:
    if client == "python":
        command, cwd = [sys.executable, "-m", "holdpoint_client.cli"], Path(settings.BASE_DIR)
    else:
        build()
        command, cwd = ["node", "dist/cli.js"], CLIENT
    env = {k: v for k, v in os.environ.items() if k != "HOLDPOINT_TOKEN"}
    return subprocess.run(
        [*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def no_stack_trace(result: subprocess.CompletedProcess[str]) -> bool:
    text = result.stdout + result.stderr
    return "Traceback" not in text and "\n    at " not in text


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_the_usage_and_exits_0(client: str, flag: str) -> None:
    result = holdpoint_worker(client, flag)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("usage: holdpoint-worker"), result.stdout
    for option in ("--url", "--token", "--concurrency", "--grace", "--lease-seconds", "--wait"):
        assert option in result.stdout
    assert no_stack_trace(result)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--bogus", "--url", "http://127.0.0.1:9", "--token", "t", "m:a"], "--bogus"),
        (["--token", "t", "m:a"], "--url"),
        (["--url", "http://127.0.0.1:9", "--token", "t", "--concurrency", "many", "m:a"], "many"),
    ],
    ids=["unknown-option", "no-url", "bad-number"],
)
def test_a_mistake_prints_the_usage_and_exits_2(client: str, args: list[str], says: str) -> None:
    result = holdpoint_worker(client, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "usage: holdpoint-worker" in result.stderr
    assert says in result.stderr
    assert no_stack_trace(result)
