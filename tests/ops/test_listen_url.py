"""Behind PgBouncer (docs/operations.md, "Behind PgBouncer"): ``DATABASE_PGBOUNCER`` turns off
server-side cursors and prepared statements, and LISTEN connects to ``DATABASE_LISTEN_URL``
(PostgreSQL itself), never through ``DATABASE_URL``."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from config.env import parse_database_url
from runs.events import WORK_CHANNEL
from runs.wakeups import listen_connection_params, listen_for_changes
from tests.ops.test_settings import manage

pytestmark = pytest.mark.postgres

SHOW = """
from django.db import connection
print(connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS", False))
print(connection.settings_dict["OPTIONS"].get("prepare_threshold", "default"))
with connection.cursor() as cursor:
    cursor.execute("SELECT 1")
print(connection.connection.prepare_threshold)
"""


# Prepared statements are off either way (Django binds on the client and connects with
# prepare_threshold=None); PgBouncer mode says so itself, so no change of Django's undoes it.
@pytest.mark.parametrize(
    ("pgbouncer", "expected"),
    [("true", ["True", "None", "None"]), ("", ["False", "default", "None"])],
)
def test_pgbouncer_mode_turns_off_server_side_cursors_and_prepared_statements(
    tmp_path: Path, test_database_url: str, pgbouncer: str, expected: list[str]
) -> None:
    result = manage(
        "shell",
        "-c",
        SHOW,
        HOLDPOINT_VAR_DIR=str(tmp_path),
        DATABASE_URL=test_database_url,
        DATABASE_PGBOUNCER=pgbouncer,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-3:] == expected


def test_listen_connects_to_the_listen_url_and_hears_a_notify(
    settings: Any, test_database_url: str
) -> None:
    import psycopg

    # The same server, told apart by the name the listener's session carries.
    settings.DATABASE_LISTEN = parse_database_url(
        f"{test_database_url}?application_name=holdpoint-listen-test"
    )
    params = listen_connection_params()
    assert params["application_name"] == "holdpoint-listen-test"
    assert "pool" not in params

    heard: list[tuple[str, str]] = []
    stop, listening = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=listen_for_changes,
        kwargs={
            "dispatch": lambda channel, payload: heard.append((channel, payload)),
            "stop": stop,
            "listening": listening,
            "on_connect": lambda: None,
            "who": "test listener",
        },
        daemon=True,
    )
    thread.start()
    try:
        assert listening.wait(30), "the listener never connected"
        with psycopg.connect(test_database_url, autocommit=True) as conn:
            sessions = conn.execute(
                "SELECT query FROM pg_stat_activity WHERE application_name = %s",
                ["holdpoint-listen-test"],
            ).fetchall()
            assert [q for (q,) in sessions if q.startswith("LISTEN")], sessions
            conn.execute("SELECT pg_notify(%s, %s)", [WORK_CHANNEL, "topology-test"])
        for _ in range(300):  # 30 s
            if (WORK_CHANNEL, "topology-test") in heard:
                break
            stop.wait(0.1)
        assert (WORK_CHANNEL, "topology-test") in heard
    finally:
        stop.set()
        thread.join(15)
