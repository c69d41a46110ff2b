"""Both clients send again what got no answer (a connection error, any 5xx) after a
bounded, jittered backoff, with the same Idempotency-Key, and never send a 4xx again; the
declaration at start-up included (two workers starting together once met a 500 there
and one exited with a traceback).

The server is ``ScriptedServer``: real HTTP that fails on cue (tests/clients/scripted_server.py).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from holdpoint_client import Problem, ServerAway
from holdpoint_client.http import BACKOFF_MAX, Api, backoff

from tests.clients.conftest import wait_for
from tests.clients.node import CLIENT, build
from tests.clients.scripted_server import Answer, ScriptedServer, problem
from tests.live.server import free_port

pytestmark = pytest.mark.process

DECLARED = {
    "name": "remote-loop",
    "version": 1,
    "created": True,
    "new_version": False,
    "input_schema": {},
    "retry_policy": {},
    "label": "",
    "description": "",
    "approval_policy": {},
    "tools": [],
}
FAILURES = [
    problem(500, "server_error", "IntegrityError"),
    Answer(503, {"detail": "restarting"}),
    Answer(502, None),
]
REFUSALS = [
    problem(400, "invalid_input"),
    problem(401, "not_authenticated"),
    problem(403, "permission_denied"),
    problem(404, "not_found"),
    problem(409, "invalid_state"),
    problem(422, "idempotency_key_reused"),
]


def gaps(seen: list[Any]) -> list[float]:
    return [b.at - a.at for a, b in itertools.pairwise(seen)]


# --- The Python client ---------------------------------------------------------------------------


def test_it_backs_off_within_bounds_and_with_jitter() -> None:
    for tries in range(1, 12):
        ceiling = min(BACKOFF_MAX, 0.1 * 2 ** (tries - 1))
        drawn = [backoff(tries) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in drawn), (tries, min(drawn), max(drawn))
        assert len(set(drawn)) > 100  # jitter: workers that failed together spread out
    assert backoff(1000) <= BACKOFF_MAX


def test_python_sends_a_5xx_again_with_the_same_key_until_it_is_answered() -> None:
    with ScriptedServer({("POST", "/api/x"): [*FAILURES, Answer(200, {"ok": True})]}) as server:
        api = Api(server.url, "hpw_test")
        try:
            assert api.call("POST", "/api/x", {"n": 1}) == (200, {"ok": True})
        finally:
            api.close()
    seen = server.requests("POST", "/api/x")
    assert len(seen) == 4
    assert len({s.key for s in seen}) == 1 and seen[0].key  # one write, sent four times
    assert all(s.body == {"n": 1} for s in seen)
    # A pause before each try again: at least half of 0.1 s, 0.2 s, 0.4 s.
    assert [g >= low for g, low in zip(gaps(seen), (0.05, 0.1, 0.2), strict=True)] == [True] * 3


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda a: str(a.status))
def test_python_never_sends_a_4xx_again(refusal: Answer) -> None:
    with ScriptedServer({("POST", "/api/x"): [refusal, Answer(200, {})]}) as server:
        api = Api(server.url, "hpw_test")
        try:
            with pytest.raises(Problem) as refused:
                api.call("POST", "/api/x", {})
        finally:
            api.close()
    assert refused.value.status == refusal.status
    assert refused.value.code == refusal.body["code"]
    assert len(server.requests("POST", "/api/x")) == 1


def test_python_tries_again_after_a_connection_error() -> None:
    port = free_port()
    got: dict[str, Any] = {}

    def call() -> None:
        api = Api(f"http://127.0.0.1:{port}", "hpw_test")
        try:
            got["answer"] = api.call("POST", "/api/x", {}, retry_for=60)
        finally:
            api.close()

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.5)  # Nothing listens yet: the client is trying again.
    assert thread.is_alive()
    with ScriptedServer({("POST", "/api/x"): [Answer(200, {"late": True})]}, port=port) as server:
        thread.join(30)
    assert got["answer"] == (200, {"late": True})
    assert len(server.requests("POST", "/api/x")) == 1


def test_python_gives_up_a_failing_server_when_its_budget_is_spent() -> None:
    with ScriptedServer({("POST", "/api/x"): [Answer(503, None)]}) as server:
        api = Api(server.url, "hpw_test")
        started = time.monotonic()
        try:
            with pytest.raises(ServerAway):
                api.call("POST", "/api/x", {}, retry_for=1.0)
        finally:
            api.close()
    assert time.monotonic() - started < 10
    assert 2 <= len(server.requests("POST", "/api/x")) <= 10  # bounded, not a busy loop


def looper_target(client: str) -> str:
    return "tests.clients.agents:looper" if client == "python" else "./test/agents.mjs:looper"


def spawn(client: str, url: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    name = f"{client}-worker"
    log = tmp_path / f"{name}.log"
    if client == "python":
        command = [sys.executable, "-m", "holdpoint_client.cli"]
        cwd = Path(settings.BASE_DIR)
    else:
        build()
        command = ["node", "dist/cli.js"]
        cwd = CLIENT
    proc = subprocess.Popen(
        [*command, "--url", url, "--wait", "1", "--name", name, looper_target(client)],
        cwd=cwd,
        env={**os.environ, "HOLDPOINT_TOKEN": "hpw_test", "PYTHONUNBUFFERED": "1"},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return proc, log


CLIENTS = ["python", "typescript"]
AGENT_NAME = {"python": "remote-loop", "typescript": "ts-loop"}


@pytest.mark.parametrize("client", CLIENTS)
def test_a_worker_declares_through_server_errors_then_serves(client: str, tmp_path: Path) -> None:
    path = f"/api/agents/{AGENT_NAME[client]}"
    script = {
        ("PUT", path): [*FAILURES, Answer(200, {**DECLARED, "name": AGENT_NAME[client]})],
        ("POST", "/api/worker/claim"): [Answer(204, None, delay=0.3)],
    }
    with ScriptedServer(script) as server:
        proc, log = spawn(client, server.url, tmp_path)
        try:
            wait_for(
                lambda: "serving" in log.read_text() or proc.poll() is not None,
                60,
                f"the {client} worker to start",
            )
            assert proc.poll() is None, log.read_text()
            wait_for(lambda: server.requests("POST", "/api/worker/claim"), 30, "a claim")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
    text = log.read_text()
    assert code == 0, text
    assert "Traceback" not in text and "    at " not in text, text
    declared = server.requests("PUT", path)
    assert len(declared) == 4, text
    assert len({d.key for d in declared}) == 1  # the same declaration, sent again
    assert all(g >= 0.05 for g in gaps(declared))


@pytest.mark.parametrize("client", CLIENTS)
def test_a_refused_declaration_is_not_sent_again_and_the_worker_says_why(
    client: str, tmp_path: Path
) -> None:
    path = f"/api/agents/{AGENT_NAME[client]}"
    refused = problem(403, "permission_denied", "This agent was declared by another token.")
    with ScriptedServer({("PUT", path): [refused, Answer(200, DECLARED)]}) as server:
        proc, log = spawn(client, server.url, tmp_path)
        try:
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    text = log.read_text()
    assert code == 1, text
    assert f"declaring agent {AGENT_NAME[client]}" in text.replace("'", ""), text
    assert "403 permission_denied: This agent was declared by another token." in text, text
    assert "Traceback" not in text and "    at " not in text, text
    assert len(server.requests("PUT", path)) == 1
    assert server.requests("POST", "/api/worker/claim") == []


# --- The TypeScript client's Api ---------------------------------------------------------------


NODE_CALL = """
import { Api, Problem } from "./dist/index.js";
const api = new Api(process.argv[1], "hpw_test");
try {
  const [status, data] = await api.call("POST", "/api/x", { n: 1 }, { retryForMs: 30000 });
  console.log(JSON.stringify({ status, data }));
} catch (error) {
  console.log(JSON.stringify({ refused: error instanceof Problem, status: error.status, code: error.code }));
}
"""


def node_call(url: str) -> dict[str, Any]:
    build()
    result = subprocess.run(
        ["node", "--input-type=module", "-e", NODE_CALL, url],
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_typescript_sends_a_5xx_again_with_the_same_key_until_it_is_answered() -> None:
    with ScriptedServer({("POST", "/api/x"): [*FAILURES, Answer(200, {"ok": True})]}) as server:
        assert node_call(server.url) == {"status": 200, "data": {"ok": True}}
    seen = server.requests("POST", "/api/x")
    assert len(seen) == 4
    assert len({s.key for s in seen}) == 1 and seen[0].key
    assert [g >= low for g, low in zip(gaps(seen), (0.05, 0.1, 0.2), strict=True)] == [True] * 3


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda a: str(a.status))
def test_typescript_never_sends_a_4xx_again(refusal: Answer) -> None:
    with ScriptedServer({("POST", "/api/x"): [refusal, Answer(200, {})]}) as server:
        answer = node_call(server.url)
    assert answer == {"refused": True, "status": refusal.status, "code": refusal.body["code"]}
    assert len(server.requests("POST", "/api/x")) == 1
