"""The TypeScript client (clients/typescript) against a live server process: Node's own
test runner (``node --test``) drives a TypeScript agent through a question, an approval,
a side effect done once through a SIGKILL of its worker, cancel, pause and SIGTERM.

This test builds the client (``npm ci`` from the committed lockfile, then ``tsc``), gives
the Node tests the server's URL, a worker token and a person's API token, and sweeps
expired leases while they run (the live server runs no workers or sweepers).
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from rest_framework.authtoken.models import Token

from runs import services
from runs.groups import ensure_default_groups
from runs.models import Run
from runs.tokens import worker_token_create
from tests.clients.conftest import LiveServer, executions
from tests.clients.node import CLIENT, build

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]


class Sweeper(threading.Thread):
    """Expire the leases of killed workers, as a runagents sweeper would."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.wait(0.2):
                services.sweep_all()
        finally:
            connection.close()


def test_the_typescript_client_passes_its_node_tests(
    live_api: LiveServer, tool_dir: Path, tmp_path: Path
) -> None:
    build()
    ensure_default_groups()  # a transactional test before this one flushed them
    admin = User.objects.create_user(username="tsadmin")
    admin.groups.add(Group.objects.get(name="admin"))
    person = Token.objects.create(user=admin).key
    second = User.objects.create_user(username="tsapprover")
    second.groups.add(Group.objects.get(name="admin"))
    approver = Token.objects.create(user=second).key
    _, token = worker_token_create(name="ts-client")
    sweeper = Sweeper()
    sweeper.start()
    try:
        result = subprocess.run(
            ["node", "--test", "--test-concurrency=1", "test/client.test.mjs"],
            cwd=CLIENT,
            env={
                **os.environ,
                "HOLDPOINT_URL": live_api.url,
                "HOLDPOINT_TOKEN": token,
                "HOLDPOINT_USER_TOKEN": person,
                "HOLDPOINT_APPROVER_TOKEN": approver,
                "HOLDPOINT_TEST_TOOL_DIR": str(tool_dir),
            },
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        sweeper.stop.set()
        sweeper.join(5)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "# fail 0" in result.stdout
    # What the Node tests did is in the database too.
    assert Run.objects.filter(agent="ts-deploy", status="succeeded").count() == 2
    assert Run.objects.filter(agent="ts-tune", status="succeeded").count() == 2
    # Two deploys and the edited irreversible call; the sent-back run acted on nothing.
    assert len(executions(tool_dir)) == 3
