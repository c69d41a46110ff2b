"""The Procfile's processes start and work together (web + worker over PostgreSQL and Redis)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.process]


@pytest.fixture
def scratch_database_url() -> Iterator[str]:
    """A database of its own, so the check's migrate and users touch nothing else."""
    url = urlsplit(os.environ["DATABASE_URL"])
    name = f"holdpoint_procfile_{secrets.token_hex(4)}"
    admin = urlunsplit(url._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(url._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_procfile_processes_serve_and_work_together(scratch_database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": scratch_database_url}
    result = subprocess.run(
        [sys.executable, "deploy/procfile_check.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "procfile check: ok" in result.stdout
    assert "worker finished run_" in result.stdout
