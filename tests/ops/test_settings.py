"""Settings from the environment: production passes check --deploy, bad values say what to fix."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``manage.py`` in a subprocess. It never sees the ``DATABASE_URL`` of the developer or CI
    (a real database that may not exist, and must not be written to): a test that needs
    PostgreSQL passes the test database's URL (``test_database_url``)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "HOLDPOINT_"))}
    base.pop("SECRET_KEY", None)
    base.pop("DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


PRODUCTION = {
    "HOLDPOINT_PRODUCTION": "1",
    "SECRET_KEY": secrets.token_urlsafe(64),
    "ALLOWED_HOSTS": "holdpoint.example.com",
    "HOLDPOINT_METRICS_TOKEN": secrets.token_urlsafe(32),
}


def test_production_settings_pass_check_deploy(tmp_path: Path) -> None:
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        HOLDPOINT_VAR_DIR=str(tmp_path),
        **PRODUCTION,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


def test_development_settings_do_not_pass_check_deploy(tmp_path: Path) -> None:
    result = manage("check", "--deploy", "--fail-level", "WARNING", HOLDPOINT_VAR_DIR=str(tmp_path))
    assert result.returncode != 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HOLDPOINT_PRODUCTION": "1"}, "SECRET_KEY is required"),
        ({**PRODUCTION, "SECRET_KEY": "short"}, "at least 50 random characters"),
        ({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean"),
        ({"DATABASE_URL": "mysql://x/y"}, "scheme 'mysql' is not supported"),
        ({"DATABASE_URL": "postgres://127.0.0.1:5432/"}, "has no database name"),
        ({"REDIS_URL": "localhost:6379"}, "must start with redis://"),
        ({"HOLDPOINT_LEASE_SECONDS": "0"}, "too small"),
        ({"HOLDPOINT_LEASE_SECONDS": "soon"}, "is not a number"),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT='xml' must be one of"),
        ({"DATABASE_POOL_SIZE": "-1"}, "DATABASE_POOL_SIZE=-1 is too small"),
        ({"DATABASE_POOL_SIZE": "many"}, "DATABASE_POOL_SIZE='many' is not a whole number"),
    ],
)
def test_bad_values_stop_start_up_with_a_message(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    result = manage("check", HOLDPOINT_VAR_DIR=str(tmp_path), **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


# Six "requests" in a row: Django closes the connection at the end of each one. Pooled,
# they share the pool's few server sessions (at most its size); unpooled, each opens one.
BACKENDS = """
from django.db import connection
pids = []
for _ in range(6):
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pids.append(cursor.fetchone()[0])
    connection.close()
pool = connection.pool
print(pool.max_size if pool else 0, len(set(pids)))
"""


@pytest.mark.postgres
@pytest.mark.parametrize(("size", "most_sessions"), [("2", 2), ("0", 6)])
def test_database_pool_size_reuses_server_sessions(
    tmp_path: Path, size: str, most_sessions: int, test_database_url: str
) -> None:
    result = manage(
        "shell",
        "-c",
        BACKENDS,
        HOLDPOINT_VAR_DIR=str(tmp_path),
        DATABASE_POOL_SIZE=size,
        DATABASE_URL=test_database_url,
    )
    assert result.returncode == 0, result.stderr
    max_size, sessions = (int(v) for v in result.stdout.split()[-2:])
    assert max_size == int(size)
    if size == "0":
        assert sessions == 6
    else:
        assert 1 <= sessions <= most_sessions
