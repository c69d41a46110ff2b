"""Issue 25, point 1: real ``holdpoint-worker`` processes of both clients tell the server who
they are (the ``Holdpoint-Worker-*`` headers on every call, docs/protocol.md): the Workers
record names each by its ``--name``, with its client and version, host, pid, agents and
concurrency, apart from the other."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from runs.models import Worker
from tests.clients.conftest import wait_for
from tests.clients.node import CLIENT
from tests.clients.test_sigterm_grace import AGENT, CLIENTS, Spawn, napping_worker

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]

__all__ = ["napping_worker"]  # the fixture, used here too

VERSION = {
    "python": "holdpoint-client-python",
    "typescript": "holdpoint-client-typescript",
}


@pytest.mark.parametrize("client", CLIENTS)
def test_a_worker_process_is_listed_as_it_says_it_is(
    client: str, napping_worker: Spawn, tool_dir: Path
) -> None:
    proc, log = napping_worker(client, f"ident-{client}", grace=1)
    row = wait_for(
        lambda: Worker.objects.filter(name=f"ident-{client}").first(), 30, "the worker's record"
    )
    assert (row.kind, row.principal, row.state) == ("remote", "token:py-client", "alive")
    assert row.client == VERSION[client]
    if client == "typescript":
        assert row.client_version == json.loads((CLIENT / "package.json").read_text())["version"]
    else:
        assert row.client_version
    assert (row.host, row.pid, row.concurrency) == (socket.gethostname(), proc.pid, 1)
    assert AGENT[client] in row.agents
    assert (row.lease_seconds, row.wait_seconds) == (3.0, 2.0)
    assert Worker.objects.filter(name__startswith="ident-").count() == 1, log.read_text()
