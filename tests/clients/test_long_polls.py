"""Long polls against a live server process: a claim whose client has gone claims nothing.

A worker that stops (SIGTERM, a deploy) aborts its waiting claim and releases its lease.
The server must not go on waiting for that claim: woken by the release, it would lease
the run again to nobody, and the run would sit ``running`` until that lease ran out.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from runs import services
from runs.models import Attempt
from tests.clients.agents import AGENTS
from tests.clients.conftest import LiveServer, status, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]


def claim_body(wait: float) -> dict[str, Any]:
    return {"worker_id": "long-poll-test", "agents": ["remote-deploy"], "wait": wait}


def open_claim(server: LiveServer, token: str, wait: float) -> socket.socket:
    """A claim sent on a raw socket, so that the test can hang up while it waits."""
    address = urlsplit(server.url)
    body = json.dumps(claim_body(wait)).encode()
    sock = socket.create_connection((address.hostname, address.port))
    sock.sendall(
        b"POST /api/worker/claim HTTP/1.1\r\n"
        + f"Host: {address.hostname}\r\n".encode()
        + f"Authorization: Bearer {token}\r\n".encode()
        + b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


def declare(server: LiveServer, token: str) -> None:
    [agent] = [a for a in AGENTS if a.name == "remote-deploy"]
    response = httpx.put(
        server.url + "/api/agents/remote-deploy",
        json=agent.declaration(),
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code in (200, 201), response.text


def test_a_claim_whose_client_hung_up_leases_nothing(
    live_api: LiveServer, token: str, operator: Any
) -> None:
    declare(live_api, token)

    ghost = open_claim(live_api, token, wait=20)
    time.sleep(0.5)  # the server is waiting on it
    ghost.close()
    time.sleep(0.5)  # the hang-up has reached the server

    run_id = services.run_start(
        agent="remote-deploy", input={"service": "auth-gateway"}, user=operator
    ).id
    time.sleep(2.0)  # a waiting claim is woken at once; this is ample
    assert status(run_id) == "queued"
    assert not Attempt.objects.filter(run_id=run_id, status="running").exists()

    # The run was there to be claimed: a claim whose client stays gets it.
    got: dict[str, Any] = {}

    def claim() -> None:
        got["response"] = httpx.post(
            live_api.url + "/api/worker/claim",
            json=claim_body(10),
            headers={"Authorization": f"Bearer {token}"},
            timeout=20,
        )

    thread = threading.Thread(target=claim)
    thread.start()
    thread.join(20)
    assert got["response"].status_code == 200, got["response"].text
    assert got["response"].json()["run_id"] == run_id
    wait_for(lambda: status(run_id) == "running", 5, "the run leased")
