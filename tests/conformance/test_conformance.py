"""One conformance suite for every client (docs/conformance.md): each scenario of
``conformance/scenarios/`` run by each client's script agent against a live server, its
people answering through the HTTP API, its faults injected into real processes, and what
the server recorded checked against the scenario's ``expect``.

Clients: the Python HTTP worker (``holdpoint-worker``), the TypeScript worker (its
``holdpoint-worker`` under Node), the server's own runtime (``manage.py runagents``), and
the in-memory harness (``runtime.testing.run_agent``) for the scenarios it can stand for.
A client runs a scenario when it offers everything the scenario ``requires``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connection
from rest_framework.authtoken.models import Token

import tests.conformance.script_runtime  # noqa: F401 - registers conf-inprocess and its tool here
from bench.common import stop_process
from ledger.models import SideEffect
from runs import services
from runs.groups import ensure_default_groups
from runs.models import Attempt, Checkpoint, InputRequest, Run, RunEvent
from runs.tokens import worker_token_create
from tests.clients.conftest import database_url, wait_until_the_server_is_idle
from tests.clients.node import CLIENT, build, npm
from tests.conformance import harness
from tests.conformance.scenarios import Scenario, check, load, operations, problems
from tests.conformance.script import OPS
from tests.live.server import free_port
from tests.waiting import wait_for

LEASE = 3.0
# Upper bounds of the waits: generous, so that they hold on a loaded machine (load 8 on
# two cores); a scenario that goes as it should takes a fraction of them.
WAIT = 45.0


@dataclass(frozen=True)
class Client:
    name: str
    agent: str
    offers: frozenset[str]


PROCESS_CLIENTS = (
    Client(
        "python",
        "conf-python",
        frozenset({"people", "crash", "processes", "control", "lease", "server"}),
    ),
    Client(
        "typescript",
        "conf-typescript",
        frozenset({"people", "crash", "processes", "control", "lease", "server"}),
    ),
    Client(
        "inprocess",
        "conf-inprocess",
        frozenset({"people", "crash", "processes", "control", "lease"}),
    ),
)
HARNESS = Client("harness", "conf-inprocess", frozenset({"people", "crash"}))

# Differences the suite found between clients, each expected to fail until it is fixed
# (strict: a fix makes the test pass, and then this entry must go). Issue 26.
KNOWN_DIFFERENCES: dict[tuple[str, str], str] = {
    # (client, scenario): why that client does not behave as the scenario says yet. Each is
    # a strict expected failure, so the entry must go when the client is fixed. Empty since
    # the one agent runtime (issue 26): key="" was read as no key in process and keyed as
    # "one." in the harness, while the HTTP clients refused it.
}


def cases(clients: tuple[Client, ...]) -> list[Any]:
    found = []
    for client in clients:
        for scenario in load():
            if not scenario.requires <= client.offers:
                continue
            marks = []
            reason = KNOWN_DIFFERENCES.get((client.name, scenario.name))
            if reason:
                marks.append(pytest.mark.xfail(reason=reason, strict=True))
            found.append(
                pytest.param(client, scenario, id=f"{client.name}-{scenario.name}", marks=marks)
            )
    return found


# The scenarios themselves ---------------------------------------------------------------


def test_it_loads_every_scenario_valid_against_the_schema() -> None:
    names = {scenario.name for scenario in load()}
    assert {
        "ask",
        "approvals",
        "side_effect_crash",
        "cancel_mid_step",
        "pause_at_boundary",
        "breakpoint",
        "sigterm_grace",
        "stale_lease",
        "server_away",
        "empty_key",
    } <= names
    assert problems(
        {
            "name": "x",
            "title": "t",
            "requires": ["teleport"],
            "script": {},
            "timeline": [],
            "expect": {},
        }
    )


def test_it_runs_each_scenario_on_some_client_and_every_operation_in_some_scenario() -> None:
    everyone = {*PROCESS_CLIENTS, HARNESS}
    for scenario in load():
        assert any(scenario.requires <= c.offers for c in everyone), scenario.name
    used = {op["op"] for s in load() for ops in s.script.values() for op in ops}
    assert used == operations()


def test_the_script_agents_know_every_operation_of_the_schema() -> None:
    assert set(OPS) == operations()
    npm()  # skipped without Node (failed in CI)
    out = subprocess.run(
        [
            "node",
            "--input-type=module",
            "-e",
            "const m = await import('./test/conformance.mjs'); console.log(JSON.stringify(m.OPERATIONS))",
        ],
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0 and "dist/index.js" in out.stderr:
        build()
        out = subprocess.run(out.args, cwd=CLIENT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert set(json.loads(out.stdout)) == operations()


def test_the_checker_reports_each_difference() -> None:
    facts = {
        "status": "succeeded",
        "result": {"a": {"x": 1}},
        "events": ["a", "b", "c"],
        "marks": ["m@1"],
        "requests": [],
    }
    assert (
        check(
            {
                "status": "succeeded",
                "result": {"a": {"x": 1}},
                "events_in_order": ["a", "c"],
                "marks": ["m@1"],
                "requests": [],
            },
            facts,
        )
        == []
    )
    wrong = check(
        {
            "status": "failed",
            "result": {"a": {"x": 2}},
            "events_in_order": ["c", "a"],
            "marks": [],
            "requests": [{"kind": "pause"}],
        },
        facts,
    )
    assert [w.split(":")[0] for w in wrong] == [
        "status",
        "result.a",
        "requests",
        "events (in this order)",
        "marks",
    ]


# The harness ---------------------------------------------------------------------------


@pytest.mark.parametrize(("client", "scenario"), cases((HARNESS,)))
def test_harness(
    client: Client, scenario: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOLDPOINT_CONFORMANCE_DIR", str(tmp_path))
    facts = harness.run(scenario, tmp_path)
    wrong = check(scenario.expect, facts)
    assert not wrong, "\n".join(wrong)


# A live server and the process clients --------------------------------------------------


class Server:
    """``daphne config.asgi:application`` against the test database, on one port for the
    module; ``down`` and ``up`` stop it and start it again there (the server away)."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = folder
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def log(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in sorted(self.folder.glob("server-*.log"))
        )

    def up(self) -> None:
        self.starts += 1
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "PYTHONUNBUFFERED": "1",
            "HOLDPOINT_AGENT_MODULES": "tests.conformance.script_runtime",
            "LOG_LEVEL": "WARNING",
        }
        log = self.folder / f"server-{self.starts}.log"
        proc = self.proc = spawn(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "config.asgi:application",
            ],
            log,
            cwd=settings.BASE_DIR,
            env=env,
        )

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the server exited: {self.log()}")
            try:
                return httpx.get(self.url + "/healthz", timeout=2).status_code < 500
            except httpx.TransportError:
                return False

        wait_for(ready, 60, "the server to answer")

    def down(self, *, kill: bool = False) -> None:
        """Stop the server: SIGTERM (graceful, which waits for requests in flight), or
        SIGKILL, the server away at once."""
        if self.proc is not None and self.proc.poll() is None and kill:
            self.proc.kill()
            self.proc.wait(10)
        elif self.proc is not None and self.proc.poll() is None:
            stop_process(self.proc, timeout=15)


@pytest.fixture(scope="module")
def server(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    with django_db_blocker.unblock():
        live = Server(tmp_path_factory.mktemp("conformance-server"))
        live.up()
    yield live
    live.down()


def spawn(command: list[str], log: Path, **options: Any) -> subprocess.Popen[bytes]:
    """Start ``command`` with its output in ``log`` (the child keeps its own descriptor)."""
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, **options)


class Sweeper(threading.Thread):
    """Expire the leases of stopped and killed workers, as any ``runagents`` would (the
    remote clients' server runs no sweeper)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.wait(0.2):
                services.sweep_all()
        finally:
            connection.close()


@dataclass
class Play:
    """One scenario played by one client: its workers, its people, its run."""

    client: Client
    scenario: Scenario
    server: Server
    folder: Path
    token: str
    starter: str
    approver: str
    run_id: str = ""
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    # People, through the HTTP API ----------------------------------------------------

    def api(self, method: str, path: str, body: Any = None, *, person: str = "") -> Any:
        response = httpx.request(
            method,
            self.server.url + path,
            json=body,
            timeout=30,
            headers={
                "Authorization": f"Token {person or self.starter}",
                "Idempotency-Key": str(uuid.uuid4()),
            },
        )
        assert response.status_code < 400, (
            f"{method} {path}: {response.status_code} {response.text}"
        )
        return response.json() if response.content else None

    def pending(self) -> dict[str, Any] | None:
        return self.api("GET", f"/api/runs/{self.run_id}")["pending_request"]

    # Workers ---------------------------------------------------------------------------

    def start_worker(self, name: str, *, lease: float, grace: float) -> None:
        common = ["--lease-seconds", str(lease), "--name", f"{self.client.name}-{name}"]
        if self.client.name == "inprocess":
            command = [
                sys.executable,
                "manage.py",
                "runagents",
                "--concurrency",
                "1",
                "--sweep-interval",
                "0.2",
                "--grace-seconds",
                str(grace),
                "--agents",
                self.client.agent,
                *common,
            ]
            cwd, ready = Path(settings.BASE_DIR), "runagents "
        else:
            remote = ["--url", self.server.url, "--wait", "2", "--grace", str(grace), *common]
            if self.client.name == "python":
                command = [
                    sys.executable,
                    "-m",
                    "holdpoint_client.cli",
                    *remote,
                    "tests.conformance.script_client:agent",
                ]
                cwd = Path(settings.BASE_DIR)
            else:
                build()
                command = ["node", "dist/cli.js", *remote, "./test/conformance.mjs:agent"]
                cwd = CLIENT
            ready = "serving"
        log = self.folder / f"{name}.log"
        proc = spawn(
            command,
            log,
            cwd=cwd,
            env={
                **os.environ,
                "HOLDPOINT_TOKEN": self.token,
                "PYTHONUNBUFFERED": "1",
                "HOLDPOINT_CONFORMANCE_DIR": str(self.folder),
                "DATABASE_URL": database_url(),
                "HOLDPOINT_AGENT_MODULES": "tests.conformance.script_runtime",
                "LOG_LEVEL": "INFO",
                "LOG_FORMAT": "text",
            },
        )
        self.workers[name], self.logs[name] = proc, log
        wait_for(
            lambda: ready in log.read_text() or proc.poll() is not None, WAIT, f"{name} to start"
        )
        assert proc.poll() is None, log.read_text()

    def stop_workers(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        for proc in self.workers.values():
            proc.wait(15)

    # What is recorded ------------------------------------------------------------------

    def marks(self) -> list[str]:
        return harness.marks(self.folder)

    def recorded(self) -> dict[str, Any]:
        run = Run.objects.get(pk=self.run_id)
        attempts = list(Attempt.objects.filter(run=run).order_by("number"))
        last = attempts[-1] if attempts else None
        return {
            "status": run.status,
            "result": run.result,
            "error": {"type": last.error_type, "message": last.error_message} if last else None,
            "requests": [
                {"kind": r.kind, "step_id": r.step_id, "status": r.status}
                for r in InputRequest.objects.filter(run=run).order_by("created_at", "pk")
            ],
            "attempts": [{"reason": a.reason, "status": a.status} for a in attempts],
            "events": list(
                RunEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True)
            ),
            "checkpoints": list(
                Checkpoint.objects.filter(run=run).order_by("number").values_list("step", flat=True)
            ),
            "ledger": [
                {"step_id": e.step_id, "status": e.status}
                for e in SideEffect.objects.filter(run=run).order_by("created_at")
            ],
            "executions": harness.executions(self.folder),
            "marks": self.marks(),
        }

    def status(self) -> str:
        return Run.objects.get(pk=self.run_id).status

    @staticmethod
    def log_tail(path: Path) -> str:
        lines = path.read_text(errors="replace").splitlines()
        return "\n".join(line for line in lines if "HTTP Request" not in line)[-4000:]

    def why(self) -> str:
        logs = "\n".join(f"--- {name}\n{self.log_tail(path)}" for name, path in self.logs.items())
        return f"{json.dumps(self.recorded(), indent=1, default=str)}\n{logs}"

    # The timeline ----------------------------------------------------------------------

    def act(self, action: dict[str, Any]) -> None:
        do = action["do"]
        worker = action.get("worker", "w1")
        if do == "start_worker":
            self.start_worker(
                worker, lease=action.get("lease_seconds", LEASE), grace=action.get("grace", 1)
            )
        elif do == "start_run":
            body: dict[str, Any] = {
                "agent": self.client.agent,
                "input": {"script": self.scenario.script},
            }
            if "pause_before" in action:
                body["pause_before"] = action["pause_before"]
            self.run_id = self.api("POST", "/api/runs", body)["run_id"]
        elif do == "wait_request":
            wait_for(
                lambda: (self.pending() or {}).get("kind") == action["kind"],
                WAIT,
                f"a pending {action['kind']} request",
            )
        elif do in ("answer", "continue"):
            request = self.pending()
            assert request is not None, "no pending request to answer"
            body = {"request_id": request["request_id"], "checkpoint_id": request["checkpoint_id"]}
            if do == "answer":
                body["value"] = action["value"]
            self.api("POST", f"/api/runs/{self.run_id}/resume", body, person=self.approver)
        elif do == "cancel":
            self.api("POST", f"/api/runs/{self.run_id}/cancel", {"reason": "conformance"})
        elif do == "pause":
            self.api("POST", f"/api/runs/{self.run_id}/pause", {"reason": "conformance"})
        elif do == "wait_mark":
            mark = action["mark"]
            wait_for(lambda: mark in self.marks(), WAIT, f"the mark {mark}")
        elif do == "wait_status":
            wanted = action["status"]
            wait_for(
                lambda: self.status() in wanted,
                max(WAIT, action.get("within", 0)),
                f"the run to be {'/'.join(wanted)}",
            )
        elif do == "wait_attempt":
            wait_for(
                lambda: Attempt.objects.filter(
                    run_id=self.run_id, reason=action["reason"]
                ).exists(),
                WAIT,
                f"an attempt {action['reason']}",
            )
        elif do == "touch":
            (self.folder / action["file"]).touch()
        elif do == "crash":
            wait_for(lambda: "acted" in self.marks(), WAIT, "the tool to act")
            self.workers[worker].send_signal(signal.SIGKILL)
            self.workers[worker].wait(15)
        elif do == "signal":
            self.workers[worker].send_signal(getattr(signal, action["signal"]))
        elif do == "wait_exit":
            code = self.workers[worker].wait(max(WAIT, action.get("within", 0)))
            assert code == 0, f"{worker} exited with {code}"
        elif do == "server_down":
            self.server.down(kill=True)
        elif do == "server_up":
            self.server.up()
        elif do == "pass_time":
            time.sleep(action["seconds"])
        elif do == "check":
            wrong = check(action["expect"], self.recorded())
            assert not wrong, "in the middle: " + "\n".join(wrong) + "\n" + self.why()
        else:
            raise AssertionError(f"unknown action {do}")


def person(name: str) -> str:
    user = User.objects.create_user(username=name)
    user.groups.add(Group.objects.get(name="admin"))
    return Token.objects.create(user=user).key


@pytest.mark.postgres
@pytest.mark.process
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("client", "scenario"), cases(PROCESS_CLIENTS))
def test_client(
    client: Client,
    scenario: Scenario,
    server: Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert connection.vendor == "postgresql"
    # The sweeper in this process may look a key up with the folder tool (script_runtime).
    monkeypatch.setenv("HOLDPOINT_CONFORMANCE_DIR", str(tmp_path))
    ensure_default_groups()  # a transactional test before this one flushed them
    play = Play(
        client,
        scenario,
        server,
        tmp_path,
        worker_token_create(name="conformance")[1],
        person("conf-starter"),
        person("conf-approver"),
    )
    sweeper = Sweeper()
    sweeper.start()
    try:
        for n, action in enumerate(scenario.timeline):
            try:
                play.act(action)
            except AssertionError as error:
                raise AssertionError(f"timeline[{n}] {action}: {error}\n{play.why()}") from None
        wrong = check(scenario.expect, play.recorded())
        assert not wrong, "\n".join(wrong) + "\n" + play.why()
    finally:
        sweeper.stopping.set()
        sweeper.join(5)
        play.stop_workers()
        if server.proc is None or server.proc.poll() is not None:
            server.up()
        wait_until_the_server_is_idle()
