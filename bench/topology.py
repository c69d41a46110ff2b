"""Holdpoint as several machines run it, on one machine: each tier its own process group
and port, as separate hosts would have them, over one PostgreSQL and one Redis.

- ``--web`` web nodes (default 2), each the Procfile's ``web`` line (uvicorn,
  ``WEB_CONCURRENCY`` worker processes, a pool of ``DATABASE_POOL_SIZE`` connections each);
- ``--live`` live nodes (default 2), each the Procfile's ``live`` line (daphne: websockets);
- ``--workers`` worker nodes (default 1), each the Procfile's ``worker`` line (``runagents``);
- Debian's nginx in front: pages and the API to the web nodes (keep-alive connections to
  them; a node that refuses the connection is skipped for the next one), ``/ws/`` to the
  live nodes with the websocket upgrade;
- Debian's PgBouncer in transaction pooling in front of PostgreSQL: every tier's
  ``DATABASE_URL`` goes through it (with ``DATABASE_PGBOUNCER=true``: no server-side
  cursors, no prepared statements), and ``DATABASE_LISTEN_URL`` goes to PostgreSQL
  itself, since NOTIFY does not reach a LISTEN through transaction pooling.

nginx and PgBouncer run unprivileged from configuration files written into a temporary
directory (no systemd, nothing under /etc); their logs and every node's are there too.

    python -m bench.topology [--web 2] [--live 2] [--workers 1] [--web-concurrency 1]
                             [--port 8080] [--no-migrate]

starts it on ``DATABASE_URL``'s database (migrated first, as the Procfile's ``release``
line) and ``REDIS_URL``, prints the address, and runs until Ctrl-C. The tests
(tests/ops/test_topology.py) and ``bench.capacity --topology`` start it with ``Topology``.
``python -m bench.topology drive`` is the small load generator the test runs in several
processes; ``python -m bench.topology seed`` makes the people and tokens it uses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from bench.common import free_ports, wait_for_http

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
BIN = Path(PYTHON).parent
NGINX_CANDIDATES = ("/usr/sbin/nginx",)
PGBOUNCER_CANDIDATES = ("/usr/sbin/pgbouncer",)
# Server connections PgBouncer keeps to PostgreSQL for the database (its default_pool_size).
PGBOUNCER_POOL_SIZE = 20


def _binary(name: str, candidates: tuple[str, ...]) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def missing_binaries() -> list[str]:
    """The Debian packages the topology needs and does not find (scripts/ensure-topology
    installs them)."""
    missing = []
    if _binary("nginx", NGINX_CANDIDATES) is None:
        missing.append("nginx-light")
    if _binary("pgbouncer", PGBOUNCER_CANDIDATES) is None:
        missing.append("pgbouncer")
    return missing


def procfile() -> dict[str, str]:
    """The Procfile's lines by process type."""
    lines: dict[str, str] = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        name, sep, command = line.partition(":")
        if sep and not line.startswith("#"):
            lines[name.strip()] = command.strip()
    return lines


def _url_with(url: str, *, host: str, port: int) -> str:
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@{host}:{port}" if auth else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


@dataclass
class Node:
    """One host's process group: a tier's process and the processes it forks."""

    tier: str
    name: str
    port: int
    proc: subprocess.Popen[Any]
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole group, as a machine that dies takes all its processes."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.kill(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        self.kill(signal.SIGKILL)  # what is left of the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout)


@dataclass
class Topology:
    """Start with ``with Topology(database_url, redis_url) as topo:``; ``topo.base`` is nginx."""

    database_url: str
    redis_url: str
    web: int = 2
    live: int = 2
    workers: int = 1
    web_concurrency: int = 1
    worker_concurrency: int = 2
    pool_size: int = 8
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    directory: Path | None = None
    nodes: list[Node] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tier(self, name: str) -> list[Node]:
        return [n for n in self.nodes if n.tier == name]

    # --- Configuration -------------------------------------------------------------------

    def _user(self) -> str | None:
        """Who nginx's workers and PgBouncer run as when started by root (PgBouncer
        refuses to run as root)."""
        if os.getuid() != 0:
            return None
        for name in ("postgres", "nobody"):
            with contextlib.suppress(KeyError):
                pwd.getpwnam(name)
                return name
        return None

    def pgbouncer_config(self, listen_port: int) -> str:
        parts = urlsplit(self.database_url)
        db = unquote(parts.path.lstrip("/"))
        host, port = parts.hostname or "127.0.0.1", parts.port or 5432
        assert self.directory is not None
        user, password = unquote(parts.username or "postgres"), unquote(parts.password or "")
        users = self.directory / "userlist.txt"
        users.write_text(f'"{user}" "{password}"\n')
        users.chmod(0o644)
        return "\n".join(
            [
                "[databases]",
                f"{db} = host={host} port={port} dbname={db}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {listen_port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {users}",
                "pool_mode = transaction",
                f"stats_users = {user}",  # SHOW STATS, SHOW POOLS on its console
                "max_client_conn = 4000",
                f"default_pool_size = {PGBOUNCER_POOL_SIZE}",
                "reserve_pool_size = 5",
                "ignore_startup_parameters = extra_float_digits",
                "log_connections = 0",
                "log_disconnections = 0",
                "",
            ]
        )

    def nginx_config(self, web_ports: list[int], live_ports: list[int], user: str | None) -> str:
        assert self.directory is not None
        tmp = self.directory / "nginx-tmp"
        web = "\n".join(
            f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=10s;" for p in web_ports
        )
        live = "\n".join(
            f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=10s;" for p in live_ports
        )
        headers = """
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;"""
        return f"""
{f"user {user};" if user else ""}
daemon off;
master_process on;
worker_processes 1;
pid {self.directory / "nginx.pid"};
error_log {self.directory / "nginx-error.log"} warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    client_max_body_size 1m;
    map $http_upgrade $connection_upgrade {{ default upgrade; "" close; }}
    upstream web {{
{web}
        keepalive 64;
        # Below the web nodes' own idle timeout (the Procfile's WEB_KEEP_ALIVE, 75 s): the
        # proxy closes an idle connection first, so it never sends on one being closed.
        keepalive_timeout 60s;
    }}
    upstream live {{
{live}
    }}
    server {{
        listen 127.0.0.1:{self.port};
        proxy_http_version 1.1;
        proxy_connect_timeout 2s;
        # A node that refuses the connection, or times out connecting: the next one.
        # A request the dead node had already taken is not sent again (a write may have
        # committed): the client retries it with its Idempotency-Key.
        proxy_next_upstream error timeout;
        proxy_next_upstream_tries 3;
        location /ws/ {{
            proxy_pass http://live;{headers}
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_read_timeout 1h;
            proxy_send_timeout 1h;
        }}
        location / {{
            proxy_pass http://web;{headers}
            proxy_set_header Connection "";
            # Long-poll claims wait up to 60 s.
            proxy_read_timeout 90s;
            proxy_buffering off;
        }}
    }}
}}
"""

    # --- Processes -------------------------------------------------------------------------

    def _spawn(self, tier: str, name: str, argv: list[str], env: dict[str, str], port: int) -> Node:
        assert self.directory is not None
        log = self.directory / f"{name}.log"
        out = open(log, "ab")  # noqa: SIM115 - the child holds it
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, as its own host
        )
        out.close()
        node = Node(tier, name, port, proc, log)
        self.nodes.append(node)
        return node

    def tier_env(self, pgbouncer_port: int) -> dict[str, str]:
        return {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "DATABASE_URL": _url_with(self.database_url, host="127.0.0.1", port=pgbouncer_port),
            "DATABASE_PGBOUNCER": "true",
            "DATABASE_LISTEN_URL": self.database_url,
            "DATABASE_POOL_SIZE": str(self.pool_size),
            "REDIS_URL": self.redis_url,
            "HOST": "127.0.0.1",
            "WEB_CONCURRENCY": str(self.web_concurrency),
            "WORKER_CONCURRENCY": str(self.worker_concurrency),
            "LOG_LEVEL": os.environ.get("LOG_LEVEL", "WARNING"),
            **self.env,
        }

    def start(self, timeout: float = 90.0) -> Topology:
        missing = missing_binaries()
        if missing:
            raise RuntimeError(
                f"the topology needs {', '.join(missing)} (bash scripts/ensure-topology)"
            )
        if self.directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="holdpoint-topology-")
            self.directory = Path(self._tmp.name)
        self.directory.chmod(0o755)  # nginx's workers and PgBouncer may run as another user
        (self.directory / "nginx-tmp").mkdir(mode=0o777, exist_ok=True)
        (self.directory / "nginx-tmp").chmod(0o777)
        # Every port at once: a port taken after a server was started but before it bound
        # its own may be the same one (a web node probed PgBouncer).
        ports = free_ports(2 + self.web + self.live)
        self.port = self.port or ports.pop()
        user = self._user()
        lines = procfile()
        try:
            pgb_port = ports.pop()
            config = self.directory / "pgbouncer.ini"
            config.write_text(self.pgbouncer_config(pgb_port))
            config.chmod(0o644)
            pgbouncer = _binary("pgbouncer", PGBOUNCER_CANDIDATES)
            assert pgbouncer is not None
            argv = [pgbouncer, *(["-u", user] if user else []), str(config)]
            self._spawn("pgbouncer", "pgbouncer", argv, dict(os.environ), pgb_port)
            env = self.tier_env(pgb_port)
            web_ports, live_ports = [], []
            for i in range(self.web):
                port = ports.pop()
                node_env = {**env, "PORT": str(port)}
                argv = ["sh", "-c", "exec " + lines["web"]]
                self._spawn("web", f"web{i + 1}", argv, node_env, port)
                web_ports.append(port)
            for i in range(self.live):
                port = ports.pop()
                node_env = {**env, "LIVE_PORT": str(port)}
                argv = ["sh", "-c", "exec " + lines["live"]]
                self._spawn("live", f"live{i + 1}", argv, node_env, port)
                live_ports.append(port)
            for i in range(self.workers):
                argv = ["sh", "-c", "exec " + lines["worker"]]
                self._spawn("worker", f"worker{i + 1}", argv, env, 0)
            nginx_conf = self.directory / "nginx.conf"
            nginx_conf.write_text(self.nginx_config(web_ports, live_ports, user))
            nginx = _binary("nginx", NGINX_CANDIDATES)
            assert nginx is not None
            argv = [
                nginx,
                "-p",
                str(self.directory),
                "-c",
                str(nginx_conf),
                "-e",
                str(self.directory / "nginx-error.log"),
            ]
            self._spawn("nginx", "nginx", argv, dict(os.environ), self.port)
            for node in self.nodes:
                if node.tier in {"web", "live"}:
                    wait_for_http(node.base + "/healthz", timeout=timeout, proc=node.proc)
                    if node.tier == "web" and self.web_concurrency > 1:
                        self._wait_children(node, self.web_concurrency, timeout)
            wait_for_http(self.base + "/healthz", timeout=timeout, proc=self.tier("nginx")[0].proc)
        except BaseException:
            self.stop()
            raise
        return self

    @staticmethod
    def _wait_children(node: Node, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["pgrep", "-g", str(node.proc.pid)], capture_output=True, text=True, check=False
            )
            if len(out.stdout.split()) > count:
                return
            time.sleep(0.2)

    def stop(self) -> None:
        # The proxy first, the database pooler last: as a deployment drains.
        order = {"nginx": 0, "web": 1, "live": 1, "worker": 2, "pgbouncer": 3}
        for node in sorted(self.nodes, key=lambda n: order.get(n.tier, 1)):
            node.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def logs(self, tail: int = 40) -> str:
        """The last lines of every node's log (for a failing test's message)."""
        parts = []
        assert self.directory is not None
        for path in sorted(self.directory.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def describe(self) -> str:
        rows = [f"nginx  {self.base}"]
        for node in self.nodes:
            if node.tier != "nginx":
                port = f":{node.port}" if node.port else ""
                rows.append(f"{node.name:<9} pid {node.proc.pid} (its own process group){port}")
        rows.append(f"logs and configuration: {self.directory}")
        return "\n".join(rows)

    def __enter__(self) -> Topology:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def topology_servers(
    stack: contextlib.ExitStack, database_url: str, web: int, concurrency: int, env: dict[str, str]
) -> tuple[list[Any], list[str]]:
    """For ``bench.capacity --topology``: start a topology of ``web`` web nodes of
    ``concurrency`` processes on ``database_url`` (closed with ``stack``); return its web
    nodes as ``bench.common.Server`` (their CPU is the web figure) and nginx's address."""
    from bench.common import Server

    topology = Topology(
        database_url,
        os.environ.get("REDIS_URL", ""),
        web=web,
        web_concurrency=concurrency,
        env=env,
    )
    stack.enter_context(topology)
    servers = [Server(base=node.base, pid=node.proc.pid) for node in topology.tier("web")]
    return servers, [topology.base]


# --- Seed: the people and tokens a load needs ----------------------------------------------


def seed() -> dict[str, str]:
    """An operator with an API token and a signed-in session, and a worker token, in
    ``DATABASE_URL``'s database (run in its own process: ``python -m bench.topology seed``)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import Group, User
    from django.test import Client
    from rest_framework.authtoken.models import Token

    from runs.groups import ensure_default_groups
    from runs.tokens import worker_token_create

    ensure_default_groups()
    name = f"topology-{uuid.uuid4().hex[:8]}"
    user = User.objects.create_user(username=name, password=uuid.uuid4().hex)
    user.groups.add(Group.objects.get(name="operator"))
    client = Client()
    client.force_login(user)
    _, worker_token = worker_token_create(name=name)
    return {
        "person_token": Token.objects.create(user=user).key,
        "worker_token": worker_token,
        "session_cookie": settings.SESSION_COOKIE_NAME,
        "session": client.cookies[settings.SESSION_COOKIE_NAME].value,
    }


def seed_in_subprocess(database_url: str, redis_url: str) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url}
    env.setdefault("LOG_LEVEL", "WARNING")
    out = subprocess.run(
        [PYTHON, "-m", "bench.topology", "seed"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# --- Drive: a small load generator, one process of several ---------------------------------

AGENT = "topology"
ENDED = {"succeeded", "failed", "cancelled"}


def retryable(response: Any) -> bool:
    """holdpoint_client's rule (clients/python/holdpoint_client/http.py): any 5xx, a 429,
    a 409 ``idempotency_in_progress`` (the first request with the key is still running,
    or died with its node: its in-progress lease runs out) are sent again, same key."""
    if response.status_code >= 500 or response.status_code == 429:
        return True
    if response.status_code == 409:
        with contextlib.suppress(Exception):
            return bool(response.json().get("code") == "idempotency_in_progress")
    return False


class Driver:
    """Simulated remote agents, each starting a run as a person would and then serving the
    agent's queue: claim, three checkpoints, complete. Every write has an Idempotency-Key
    and is retried with the same key after a transport error or an answer ``retryable``
    calls worth another try, as holdpoint_client does, until ``give_up`` seconds. What each write meant
    and what came of it is recorded: ``writes`` (kind, key, run id, status, tries)."""

    def __init__(self, base: str, tokens: dict[str, str], *, tag: str, give_up: float) -> None:
        self.base = base
        self.tokens = tokens
        self.tag = tag
        self.give_up = give_up
        self.writes: list[dict[str, Any]] = []
        self.started: list[str] = []
        self.completed: list[str] = []
        self.ended: set[str] = set()
        self.answered: list[str] = []  # completes answered 409 after a retry
        self.errors: list[str] = []

    async def write(
        self,
        client: Any,
        kind: str,
        path: str,
        body: Any,
        auth: str,
        run_id: str = "",
        mark: str = "",
    ) -> Any:
        key = str(uuid.uuid4())
        headers = {"Authorization": auth, "Idempotency-Key": key}
        record: dict[str, Any] = {
            "kind": kind,
            "key": key,
            "run": run_id,
            "tries": 0,
            "mark": mark,
            "at": time.time(),  # wall clock: the test compares it with the kill
        }
        self.writes.append(record)
        deadline = time.monotonic() + self.give_up
        delay = 0.1
        while True:
            record["tries"] += 1
            try:
                response = await client.post(path, json=body, headers=headers)
            except Exception as exc:  # the node died under the call: retry, same key
                record["status"] = f"transport {type(exc).__name__}"
            else:
                record["status"] = response.status_code
                if not retryable(response):
                    if response.status_code >= 400:
                        with contextlib.suppress(Exception):
                            record["code"] = response.json().get("code")
                    return response
                record.setdefault("retried_on", []).append(response.status_code)
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def agent(self, index: int, end: float, drain_end: float) -> None:
        import httpx

        worker = f"Bearer {self.tokens['worker_token']}"
        person = f"Token {self.tokens['person_token']}"
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as client:
            idle = 0
            n = 0
            while time.monotonic() < drain_end:
                loading = time.monotonic() < end
                if loading:
                    n += 1
                    response = await self.write(
                        client,
                        "start",
                        "/api/runs",
                        {"agent": AGENT, "input": {"who": f"{self.tag}-{index}-{n}"}},
                        person,
                    )
                    if response is not None and response.status_code == 201:
                        self.started.append(response.json()["run_id"])
                    elif response is not None:
                        self.errors.append(f"start {response.status_code} {response.text[:200]}")
                claim = {
                    "worker_id": f"{self.tag}-{index}",
                    "agents": [AGENT],
                    "lease_seconds": 30,
                    "wait": 2 if not loading else 5,
                }
                response = await self.write(client, "claim", "/api/worker/claim", claim, worker)
                if response is None or response.status_code != 200:
                    if response is not None and response.status_code != 204:
                        self.errors.append(f"claim {response.status_code} {response.text[:200]}")
                    idle += 1
                    if not loading and idle >= 2 and not await self.unfinished(client, person):
                        return  # nothing left to claim, and every run this process started ended
                    continue
                idle = 0
                await self.attempt(client, response.json(), worker)

    def writes_tried(self, run_id: str) -> bool:
        return any(
            w["run"] == run_id and w["kind"] == "complete" and w["tries"] > 1 for w in self.writes
        )

    async def unfinished(self, client: Any, person: str) -> int:
        """How many runs this process started have not ended. One whose lease was granted
        to a request that died with its node (the retry found the key's in-progress lease
        run out, ran again, and got another run) is ended by another attempt once that
        lease expires: the drain goes on claiming until then."""
        left = 0
        for run_id in self.started:
            if run_id in self.ended:
                continue
            with contextlib.suppress(Exception):
                response = await client.get(
                    f"/api/runs/{run_id}", headers={"Authorization": person}
                )
                if response.json().get("status") in ENDED:
                    self.ended.add(run_id)
                    continue
            left += 1
        return left

    async def attempt(self, client: Any, lease: dict[str, Any], worker: str) -> None:
        url = f"/api/worker/attempts/{lease['attempt_id']}"
        epochs = {"lease_epoch": lease["lease_epoch"], "cancel_epoch": lease["cancel_epoch"]}
        run_id = lease["run_id"]
        for step in range(3):
            key_state = {"n": step, "mark": uuid.uuid4().hex}
            body = {**epochs, "step": "work", "state": key_state}
            response = await self.write(
                client, "checkpoint", f"{url}/checkpoint", body, worker, run_id, key_state["mark"]
            )
            if response is None or response.status_code != 201:
                self.errors.append(f"checkpoint {getattr(response, 'status_code', None)} {run_id}")
                return
        body = {**epochs, "result": {"steps": 3}}
        response = await self.write(client, "complete", f"{url}/complete", body, worker, run_id)
        if response is not None and response.status_code < 300:
            self.completed.append(run_id)
        elif response is not None and response.status_code == 409 and self.writes_tried(run_id):
            # The first try died with its node after its commit, and the retry ran again
            # once the key's in-progress lease ran out: the 409 says what happened
            # (runs/idempotency.py); the run's state in the database says the rest.
            self.answered.append(run_id)
        else:
            self.errors.append(f"complete {getattr(response, 'status_code', None)} {run_id}")

    async def main(self, agents: int, seconds: float, drain: float) -> None:
        now = time.monotonic()
        await asyncio.gather(
            *(self.agent(i, now + seconds, now + seconds + drain) for i in range(agents))
        )


def declare(base: str, worker_token: str, name: str = AGENT) -> None:
    """Declare the simulated HTTP-worker agent ``name``."""
    import httpx
    from holdpoint_client import Agent

    body = Agent(name=name, description="bench.topology simulated agent").declaration()
    body = {k: v for k, v in body.items() if v not in (None, {}) or k == "input_schema"}
    response = httpx.put(
        f"{base}/api/agents/{name}",
        json=body,
        headers={"Authorization": f"Bearer {worker_token}", "Idempotency-Key": str(uuid.uuid4())},
        timeout=30,
    )
    response.raise_for_status()


def drive(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench.topology drive")
    parser.add_argument("--base", required=True)
    parser.add_argument("--tokens", required=True, help="the JSON `seed` printed, in a file")
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--drain", type=float, default=60, help="at most s to finish after")
    parser.add_argument("--give-up", type=float, default=60, help="retry a write this long")
    parser.add_argument("--tag", default=f"drive{os.getpid()}")
    parser.add_argument("--out", required=True)
    opts = parser.parse_args(argv)
    tokens = json.loads(Path(opts.tokens).read_text())
    driver = Driver(opts.base, tokens, tag=opts.tag, give_up=opts.give_up)
    asyncio.run(driver.main(opts.agents, opts.seconds, opts.drain))
    Path(opts.out).write_text(
        json.dumps(
            {
                "writes": driver.writes,
                "started": driver.started,
                "completed": driver.completed,
                "answered": driver.answered,
                "errors": driver.errors,
            }
        )
    )


# --- Command line ------------------------------------------------------------------------------


def up(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--web", type=int, default=2, help="web nodes (default 2)")
    parser.add_argument("--live", type=int, default=2, help="live nodes (default 2)")
    parser.add_argument("--workers", type=int, default=1, help="worker nodes (default 1)")
    parser.add_argument(
        "--web-concurrency", type=int, default=1, help="uvicorn processes per web node (1)"
    )
    parser.add_argument("--port", type=int, default=8080, help="nginx's port (default 8080)")
    parser.add_argument("--no-migrate", action="store_true", help="skip the release step")
    opts = parser.parse_args(argv)
    database_url, redis_url = os.environ.get("DATABASE_URL", ""), os.environ.get("REDIS_URL", "")
    if not database_url.startswith(("postgres://", "postgresql://")) or not redis_url:
        sys.exit("The topology needs DATABASE_URL=postgres://… and REDIS_URL=redis://…")
    if not opts.no_migrate:
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, check=True
        )
    topology = Topology(
        database_url,
        redis_url,
        web=opts.web,
        live=opts.live,
        workers=opts.workers,
        web_concurrency=opts.web_concurrency,
        port=opts.port,
    )

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM too: stop every node's group, which has its own session

    signal.signal(signal.SIGTERM, interrupted)
    with topology:
        print(topology.describe(), flush=True)
        print("Ctrl-C stops it.", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while all(n.alive() for n in topology.nodes):
                time.sleep(1)
            dead = [n.name for n in topology.nodes if not n.alive()]
            print(f"stopped: {', '.join(dead)} exited\n{topology.logs()}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["seed"]:
        print(json.dumps(seed()))
    elif args[:1] == ["drive"]:
        drive(args[1:])
    else:
        up(args[1:] if args[:1] == ["up"] else args)


if __name__ == "__main__":
    main()
