"""The chaos harness: real processes, real faults, then invariants checked from the database.

It starts a private PostgreSQL cluster (so that restarting it disturbs nobody, see
``chaos/pg.py``), one daphne web server, 3-4 ``manage.py runagents`` worker processes
and a loopback webhook receiver that counts deliveries; creates >= 1,000 runs of the
demo agents; then for a bounded time:

- ``SIGKILL``s a random worker (restarted by the harness, as a supervisor would) or
  freezes one with ``SIGSTOP`` for a few seconds and thaws it with ``SIGCONT``;
- sends control requests over HTTP at random moments: cancel and retry, each time as a
  duplicate (the same key twice in a row, the same key twice at once, two different
  keys, the same key with a different body);
- answers hold points twice at once from two clients (two people, two keys);
- restarts PostgreSQL once, half-way.

Then it thaws everything, lets the workers settle, stops them, and checks the
invariants (``chaos/invariants.py``) and prints what it counted. Exit status 1 on any
violation, 2 when the run could not be carried out.

    python -m chaos.harness            # the long run (make chaos): 5 min of faults
    python -m chaos.harness --short    # about 2 minutes in all (CI)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    RESULTS_DIR,
    free_port,
    machine,
    person,
    table,
    wait_for_http,
)
from chaos import invariants, pg, receiver  # noqa: E402


def demo_input(agent: str, hook_base: str, rng: random.Random) -> dict[str, Any] | None:
    """Inputs for the demo agents that make interesting runs (None: build one from the schema).

    Some flaky deploys fail for good or repeat their error; one webhook fan-out in ten
    has a subscriber slower than the webhook tool's timeout, so its outcome is unknown
    and the ledger must reconcile it.
    """
    if agent == "flaky-deploy":
        mode = rng.choices(["transient", "deterministic", "repeated", "none"], [6, 1, 1, 2])[0]
        return {"service": "checkout", "mode": mode, "failures": rng.randint(0, 2)}
    if agent == "webhook-fanout":
        value: dict[str, Any] = {
            "base_url": hook_base,
            "event": "chaos",
            "subscribers": ["billing", "search", "analytics"],
            "slow": "none",
        }
        if rng.random() < 0.1:
            value.update(slow="analytics", slow_seconds=3)
        return value
    if agent == "auth-token-migration":
        # A few runs share each document: some writes race, and a write makes the other
        # runs' pending approvals about that document out of date.
        return {"notify": "owners@example.com", "document": f"chaos/auth-{rng.randrange(25)}.json"}
    return None


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- Values that fit a schema --------------------------------------------------------------------


def value_for(schema: Any, name: str, hook_url: str, rng: random.Random) -> Any:
    """A small valid value for a JSON Schema (enough for the demo agents' inputs and questions)."""
    if not isinstance(schema, dict):
        return "chaos"
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return value_for(schema[key][0], name, hook_url, rng)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {
            key: value_for(props.get(key, {}), key, hook_url, rng)
            for key in schema.get("required", list(props)[:1])
        }
    if kind == "array":
        items = schema.get("items", {"type": "string"})
        return [
            value_for(items, name, hook_url, rng) for _ in range(max(1, schema.get("minItems", 1)))
        ]
    if kind in ("integer", "number"):
        low = schema.get("minimum", 1)
        high = schema.get("maximum", low + 2)
        return rng.randint(int(low), int(high)) if kind == "integer" else float(low)
    if kind == "boolean":
        return False
    # Formats are checked (runs.schemas): give what each one asks for.
    if schema.get("format") == "date":
        return "2026-01-0" + str(rng.randint(1, 9))
    if schema.get("format") == "email":
        return "chaos@example.com"
    if schema.get("format") == "uri" or any(
        w in name.lower() for w in ("url", "target", "endpoint", "hook")
    ):
        return hook_url
    length = max(1, schema.get("minLength", 5))
    return ("chaos-" + uuid.uuid4().hex)[: max(length, min(schema.get("maxLength", 20), 20))]


# --- Processes -------------------------------------------------------------------------------------


class Workers:
    """The worker processes, restarted when they die (killed or crashed)."""

    def __init__(
        self,
        count: int,
        command: list[str],
        env: dict[str, str],
        logdir: Path,
        *,
        remote: list[str] | None = None,
        remote_count: int = 0,
    ) -> None:
        # One command per slot: ``runagents`` processes, then remote ``holdpoint-worker``
        # processes (the Python client), killed and frozen alike.
        self.commands = [command] * count + [remote or command] * remote_count
        self.local_count = count
        self.env = env
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stopped: set[int] = set()
        self.lock = threading.Lock()
        self.started = 0
        self.unexpected_exits = 0
        for slot in range(len(self.commands)):
            self.procs.append(self._spawn(slot))

    def _spawn(self, slot: int) -> subprocess.Popen[bytes]:
        self.started += 1
        kind = "remote" if slot >= self.local_count else "worker"
        out = open(self.logdir / f"{kind}-{self.started}.log", "ab")  # noqa: SIM115
        return subprocess.Popen(self.commands[slot], cwd=ROOT, env=self.env, stdout=out, stderr=out)

    def supervise(self) -> None:
        """Restart every worker that exited on its own (a supervisor's job)."""
        with self.lock:
            for i, proc in enumerate(self.procs):
                if proc.poll() is not None:
                    self.unexpected_exits += 1
                    log(f"worker pid {proc.pid} exited ({proc.returncode}); restarting")
                    self.procs[i] = self._spawn(i)

    def kill_one(self, rng: random.Random) -> int:
        with self.lock:
            i = rng.randrange(len(self.procs))
            proc = self.procs[i]
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            self.stopped.discard(proc.pid)
            self.procs[i] = self._spawn(i)
            return proc.pid

    def freeze_one(self, rng: random.Random) -> int | None:
        with self.lock:
            running = [p for p in self.procs if p.pid not in self.stopped and p.poll() is None]
            if not running:
                return None
            proc = rng.choice(running)
            os.kill(proc.pid, signal.SIGSTOP)
            self.stopped.add(proc.pid)
            return proc.pid

    def thaw(self, pid: int) -> None:
        with self.lock:
            if pid in self.stopped:
                self.stopped.discard(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def thaw_all(self) -> None:
        for pid in list(self.stopped):
            self.thaw(pid)

    def stop(self) -> None:
        self.thaw_all()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- Control requests ------------------------------------------------------------------------------


class Controller:
    """Two people (two tokens) sending control requests over HTTP, duplicates included.

    Plain ``http.client``, one connection per request, so the CI run needs nothing that
    ``.[dev]`` does not install.
    """

    def __init__(self, base: str, tokens: dict[str, str], seed: int) -> None:
        self.host, port = base.removeprefix("http://").split(":")
        self.port = int(port)
        self.tokens = tokens
        self.clients = list(tokens)
        self.log: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.patterns: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()

    def _send(self, principal: str, path: str, body: dict[str, Any], key: str) -> tuple[int, bool]:
        import http.client

        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(
                "POST",
                path,
                body=json.dumps(body),
                headers={
                    "Authorization": f"Token {self.tokens[principal]}",
                    "Content-Type": "application/json",
                    "Idempotency-Key": key,
                },
            )
            response = conn.getresponse()
            response.read()
            return response.status, response.getheader("Idempotent-Replayed") == "true"
        finally:
            conn.close()

    def post(
        self, principal: str, op: str, run_id: str, body: dict[str, Any], key: str
    ) -> tuple[int, bool]:
        """POST once; a 5xx or a dropped connection is retried with the same key (that is
        what a client does, and what the key is for)."""
        status, replayed = 0, False
        for _ in range(8):
            try:
                status, replayed = self._send(principal, f"/api/runs/{run_id}/{op}", body, key)
            except Exception:
                status, replayed = 599, False
            with self.lock:
                self.log.append(
                    {
                        "principal": f"user:{principal}",
                        "key": key,
                        "op": op,
                        "run_id": run_id,
                        "status": status,
                        "replayed": replayed,
                    }
                )
                self.statuses[f"{op} {status}{' replayed' if replayed else ''}"] += 1
            if status < 500:
                break
            time.sleep(0.5)
        return status, replayed

    def duplicate(self, op: str, run_id: str, body: dict[str, Any]) -> None:
        pattern = self.rng.choice(["same key twice", "same key at once", "two keys", "key reused"])
        self.patterns[f"{op}: {pattern}"] += 1
        who = self.rng.choice(list(self.clients))
        key = f"{op}-{uuid.uuid4()}"
        if pattern == "same key twice":
            self.post(who, op, run_id, body, key)
            self.post(who, op, run_id, body, key)
        elif pattern == "same key at once":
            threads = [
                threading.Thread(target=self.post, args=(who, op, run_id, body, key))
                for _ in range(2)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        elif pattern == "two keys":
            other = next(p for p in self.clients if p != who)
            self.post(who, op, run_id, body, key)
            self.post(other, op, run_id, body, f"{op}-{uuid.uuid4()}")
        else:  # the same key with a different body: 422, and nothing changes
            self.post(who, op, run_id, body, key)
            self.post(who, op, run_id, {**body, "reason": "a different request"}, key)

    def answer_twice(self, run_id: str, request_id: str, checkpoint_id: str, value: Any) -> None:
        """Two people answer the same question at the same moment, each with their own key."""
        self.patterns["resume: two people at once"] += 1
        body = {"request_id": request_id, "checkpoint_id": checkpoint_id, "value": value}
        barrier = threading.Barrier(len(self.clients))

        def go(principal: str) -> None:
            barrier.wait()
            self.post(principal, "resume", run_id, body, f"resume-{uuid.uuid4()}")

        threads = [threading.Thread(target=go, args=(p,)) for p in self.clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


# --- The run -----------------------------------------------------------------------------------


def _setup_people() -> dict[str, str]:
    tokens = {}
    for name in ("chaos-a", "chaos-b"):
        user, tokens[name] = person(name, "admin")
        # Notifications (issue 18) go to them: e-mails to the file backend, counted after.
        user.email = f"{name}@chaos.example"
        user.save(update_fields=["email"])
    return tokens


REMOTE_AGENT = "chaos-remote"
# One run in this many is the remote agent's, served through the Python client.
REMOTE_SHARE = 7


def _declare_remote() -> None:
    """Declare the remote agent as its worker will (so runs can start before it is up)."""
    from runs import services

    services.agent_declare(
        name=REMOTE_AGENT,
        actor="system:chaos",
        owners=["chaos-remote"],  # the token its worker declares it with
        input_schema={"hook_url": "string"},
        description="Remote agent (Python client) of the chaos harness",
    )


def _create_runs(
    count: int, hook_url: str, rng: random.Random, *, remote: bool = False
) -> Counter[str]:
    from runs import services
    from runs.agents import python_agent_specs

    specs = [s for s in python_agent_specs() if s.name != "test-agent"]
    if not specs:
        raise SystemExit("chaos: no Python agents are registered (are the demo agents installed?)")
    made: Counter[str] = Counter()
    for i in range(count):
        if remote and i % REMOTE_SHARE == REMOTE_SHARE - 1:
            services.run_start(
                agent=REMOTE_AGENT, input={"hook_url": hook_url}, actor="system:chaos"
            )
            made[REMOTE_AGENT] += 1
            continue
        spec = specs[i % len(specs)]
        value = demo_input(spec.name, hook_url.rsplit("/hooks", 1)[0], rng)
        if value is None:
            value = value_for(spec.input_schema or {"type": "object"}, spec.name, hook_url, rng)
        services.run_start(agent=spec.name, input=value, actor="system:chaos")
        made[spec.name] += 1
    return made


def _remote_statuses() -> dict[str, int]:
    """Where the runs served through the Python client ended."""
    from django.db.models import Count

    from runs.models import Run

    rows = Run.objects.filter(agent=REMOTE_AGENT).values("status").annotate(n=Count("id"))
    return {row["status"]: row["n"] for row in rows}


def _pick(status: list[str], rng: random.Random) -> Any:
    from runs.models import Run

    ids = list(Run.objects.filter(status__in=status).values_list("id", flat=True)[:200])
    return rng.choice(ids) if ids else None


def _control_loop(ctl: Controller, stop: threading.Event, rng: random.Random) -> None:
    from django.db import close_old_connections

    while not stop.is_set():
        close_old_connections()
        try:
            roll = rng.random()
            if roll < 0.45:
                run_id = _pick(
                    ["queued", "running", "waiting", "input_required", "auth_required"], rng
                )
                if run_id:
                    ctl.duplicate("cancel", run_id, {"reason": "chaos"})
            elif roll < 0.8:
                run_id = _pick(["failed", "cancelled"], rng)
                if run_id:
                    ctl.duplicate("retry", run_id, {"reason": "chaos retry"})
            else:
                _answer_one(ctl, rng)
        except Exception as exc:  # the database may be restarting
            log(f"control loop: {type(exc).__name__}: {exc}"[:200])
            time.sleep(0.5)
        stop.wait(rng.uniform(0.05, 0.3))


def _answer_one(ctl: Controller, rng: random.Random) -> None:
    from runs.models import InputRequest

    pending_requests = InputRequest.objects.filter(status="pending")
    if rng.random() < 0.6:
        # Approvals first, more often than not: they lead straight to side effects.
        pending_requests = pending_requests.order_by("kind")  # auth_required < input_required
    pending = list(
        pending_requests.values_list("run_id", "id", "checkpoint_id", "kind", "accepted_schema")[
            :100
        ]
    )
    if not pending:
        return
    run_id, request_id, checkpoint_id, kind, schema = rng.choice(pending)
    if kind == "auth_required":
        value: Any = {"decision": "approve" if rng.random() < 0.8 else "deny", "comment": "chaos"}
    elif "versions" in (schema or {}).get("properties", {}):
        value = {"versions": rng.choice([["v2", "v3"], ["v3"], ["v1", "v2", "v3"]])}
    else:
        value = value_for(schema, "answer", "", rng)
    ctl.answer_twice(run_id, request_id, checkpoint_id, value)


def _answer_loop(ctl: Controller, stop: threading.Event, rng: random.Random) -> None:
    from django.db import close_old_connections

    while not stop.is_set():
        close_old_connections()
        try:
            _answer_one(ctl, rng)
        except Exception as exc:
            log(f"answer loop: {type(exc).__name__}: {exc}"[:200])
            time.sleep(0.5)
        stop.wait(rng.uniform(0.02, 0.1))


def _sampler(
    stop: threading.Event, samples: dict[str, list[tuple[int, int]]], live: list[str]
) -> None:
    from django.db import close_old_connections, connection

    while not stop.wait(1.0):
        close_old_connections()
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT id, lease_epoch, cancel_epoch FROM runs_run")
                for run_id, lease, cancel in cursor.fetchall():
                    seen = samples[run_id]
                    if not seen or seen[-1] != (lease, cancel):
                        seen.append((lease, cancel))
                cursor.execute(
                    "SELECT run_id FROM runs_attempt WHERE status = 'running' "
                    "AND lease_expires_at > now() GROUP BY run_id HAVING count(*) > 1"
                )
                live.extend(r[0] for r in cursor.fetchall())
        except Exception:
            continue


def _unsettled() -> int:
    from django.db import close_old_connections, connection

    close_old_connections()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM ({invariants.UNSETTLED_SQL}) u")
        return int(cursor.fetchone()[0])


def results_path(now: time.struct_time | None = None) -> Path:
    """The long run's report file of the UTC date ``now``: ``bench/results/<date>-chaos.md``."""
    return RESULTS_DIR / f"{time.strftime('%Y-%m-%d', now or time.gmtime())}-chaos.md"


def write_results(report: str, argv: list[str] | None, now: time.struct_time | None = None) -> Path:
    """Write the report, with the command and the machine, to ``results_path(now)`` (a
    second run that day replaces it). docs/reliability.md links to the latest one."""
    now = now or time.gmtime()
    args = " ".join(sys.argv[1:] if argv is None else argv)
    text = "\n".join(
        [
            f"# `make chaos`, {time.strftime('%Y-%m-%d', now)}",
            "",
            f"`python -m chaos.harness {args}`".replace(" `", "`"),
            f"({time.strftime('%Y-%m-%d %H:%M UTC', now)}; machine: "
            + json.dumps(machine(), sort_keys=True)
            + "). What the invariants mean: "
            "[docs/reliability.md](../../docs/reliability.md).",
            "",
            "```text",
            report.strip(),
            "```",
            "",
        ]
    )
    path = results_path(now)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="about 2 minutes in all (CI)")
    parser.add_argument("--duration", type=float, help="seconds of faults (long 300, short 45)")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--workers", type=int, help="worker processes (long 4, short 3)")
    parser.add_argument("--concurrency", type=int, default=2, help="threads per worker")
    parser.add_argument(
        "--remote-workers",
        type=int,
        default=1,
        help="holdpoint-worker processes (the Python client) serving a share of the runs",
    )
    parser.add_argument("--kills", type=int, help="SIGKILLs to send (long 60, short 15)")
    parser.add_argument("--lease-seconds", type=float, default=3.0)
    parser.add_argument(
        "--settle", type=float, help="at most this many seconds of settling (long 300, short 150)"
    )
    parser.add_argument(
        "--answering",
        type=float,
        help="seconds the people go on answering after the faults (long 60, short 30)",
    )
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--no-pg-restart", action="store_true")
    parser.add_argument("--result", type=Path, help="where to write the JSON result")
    parser.add_argument(
        "--write-results",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write the report to bench/results/<date>-chaos.md (default: the long run only)",
    )
    opts = parser.parse_args(argv)
    duration = opts.duration or (45.0 if opts.short else 300.0)
    workers_n = opts.workers or (3 if opts.short else 4)
    kills_target = opts.kills or (15 if opts.short else 60)
    settle = opts.settle or (150.0 if opts.short else 300.0)
    answering = opts.answering if opts.answering is not None else (30.0 if opts.short else 60.0)
    rng = random.Random(opts.seed)
    started = time.monotonic()

    log(
        f"seed {opts.seed}; {opts.runs} runs, {workers_n} workers x {opts.concurrency}, "
        f"{duration:.0f} s of faults, >= {kills_target} kills"
    )

    bindir = pg.find_bindir()
    if bindir is None:
        print("chaos: PostgreSQL server binaries (initdb, pg_ctl) not found; set CHAOS_PG_BINDIR")
        return 2
    cluster = pg.PrivateCluster(bindir, free_port())
    logdir = Path(
        os.environ.get("CHAOS_LOG_DIR")
        or ROOT / "var" / "chaos-logs" / time.strftime("%Y%m%d-%H%M%S")
    )
    hook_server = web = workers = None
    try:
        cluster.start()
        logdir.mkdir(parents=True, exist_ok=True)
        # The outside world of this run only: a reused CHAOS_LOG_DIR starts empty.
        config_root, mail_dir = logdir / "config-store", logdir / "mail"
        for directory in (config_root, mail_dir):
            shutil.rmtree(directory, ignore_errors=True)
        log(f"private PostgreSQL on port {cluster.port} ({cluster.root})")
        hook_port = free_port()
        hook_server, book = receiver.start(hook_port)
        hook_url = f"http://127.0.0.1:{hook_port}/hooks/chaos"
        env = {
            **os.environ,
            "DATABASE_URL": cluster.url,
            "HOLDPOINT_WEBHOOK_LOOKUP_URL": f"http://127.0.0.1:{hook_port}/deliveries/{{idempotency_key}}",
            "HOLDPOINT_LEDGER_SETTLE_SECONDS": "2",
            "HOLDPOINT_WEBHOOK_TIMEOUT_SECONDS": "2",
            # The receiver is on loopback, which the outbound guard refuses by default.
            "HOLDPOINT_OUTBOUND_ALLOW_LOCAL": "true",
            "HOLDPOINT_IDEMPOTENCY_IN_PROGRESS_SECONDS": "5",
            "HOLDPOINT_LEASE_SECONDS": str(opts.lease_seconds),
            "HOLDPOINT_CONFIG_STORE_DIR": str(config_root),
            # Every message on disk, to count against the ledger afterwards.
            "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "EMAIL_FILE_PATH": str(mail_dir),
            # The notification outbox: the admins' group webhook on the same receiver, and
            # a short digest interval so that the run's end finds every message sent.
            "HOLDPOINT_NOTIFY_WEBHOOKS": f"admin=http://127.0.0.1:{hook_port}/notify/admin",
            "HOLDPOINT_NOTIFY_MIN_INTERVAL_SECONDS": "2",
            "LOG_LEVEL": "WARNING",
        }
        os.environ.update({k: env[k] for k in env if k.startswith(("DATABASE_URL", "HOLDPOINT_"))})
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
        )
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        import django

        django.setup()
        tokens = _setup_people()

        port = free_port()
        web_log = open(logdir / "web.log", "ab")  # noqa: SIM115
        web = subprocess.Popen(
            [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=web_log,
            stderr=web_log,
        )
        base = f"http://127.0.0.1:{port}"
        wait_for_http(base + "/healthz")
        command = [
            PYTHON,
            "manage.py",
            "runagents",
            "--concurrency",
            str(opts.concurrency),
            "--lease-seconds",
            str(opts.lease_seconds),
            "--sweep-interval",
            "0.5",
        ]
        remote_command: list[str] | None = None
        if opts.remote_workers:
            from runs.tokens import worker_token_create

            _declare_remote()
            remote_command = [
                PYTHON,
                "-m",
                "holdpoint_client.cli",
                "--url",
                base,
                "--token",
                worker_token_create(name="chaos-remote")[1],
                "--concurrency",
                str(opts.concurrency),
                "--lease-seconds",
                str(opts.lease_seconds),
                "--wait",
                "5",
                "--grace",
                "2",
                "chaos.remote_agents:AGENTS",
            ]
        workers = Workers(
            workers_n, command, env, logdir, remote=remote_command, remote_count=opts.remote_workers
        )
        # The workers are up first, so they start on the runs while the rest are created.
        made = _create_runs(opts.runs, hook_url, rng, remote=bool(opts.remote_workers))
        log(f"created {sum(made.values())} runs: {dict(made)}")
        ctl = Controller(base, tokens, opts.seed)

        stop = threading.Event()
        samples: dict[str, list[tuple[int, int]]] = defaultdict(list)
        live_overlaps: list[str] = []
        threads = [
            threading.Thread(
                target=_control_loop, args=(ctl, stop, random.Random(opts.seed + i)), daemon=True
            )
            for i in range(2)
        ]
        threads.append(
            threading.Thread(target=_sampler, args=(stop, samples, live_overlaps), daemon=True)
        )
        for t in threads:
            t.start()

        kills = freezes = 0
        frozen: list[tuple[float, int]] = []
        pg_restart_seconds = None
        chaos_start = time.monotonic()
        pg_restart_at = chaos_start + duration / 2
        chaos_end = chaos_start + duration
        next_fault = chaos_start + 1.0
        interval = duration / (kills_target * 1.35)
        while time.monotonic() < chaos_end:
            now = time.monotonic()
            for thaw_at, pid in list(frozen):
                if now >= thaw_at:
                    workers.thaw(pid)
                    frozen.remove((thaw_at, pid))
            if now >= next_fault:
                if rng.random() < 0.75 or kills < kills_target * (now - chaos_start) / duration:
                    pid = workers.kill_one(rng)
                    kills += 1
                else:
                    frozen_pid = workers.freeze_one(rng)
                    if frozen_pid:
                        freezes += 1
                        frozen.append((now + rng.uniform(1.0, opts.lease_seconds * 2), frozen_pid))
                next_fault = now + rng.uniform(0.5, 1.5) * interval
            if pg_restart_seconds is None and not opts.no_pg_restart and now >= pg_restart_at:
                log("restarting PostgreSQL")
                pg_restart_seconds = cluster.restart()
                log(f"PostgreSQL back after {pg_restart_seconds:.1f} s")
            workers.supervise()
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(30)
        workers.thaw_all()
        log(
            f"faults over: {kills} SIGKILL, {freezes} SIGSTOP/SIGCONT; the people answer "
            f"for {answering:.0f} s more, then settling (<= {settle:.0f} s)"
        )
        # The people keep answering (each question twice, from both) for a while after the
        # faults, so that runs go on past their hold points to the writes and e-mails that
        # follow them; then they stop, and nothing outside the workers moves the runs.
        answers_stop = threading.Event()
        answerer = threading.Thread(
            target=_answer_loop,
            args=(ctl, answers_stop, random.Random(opts.seed + 99)),
            daemon=True,
        )
        answerer.start()
        answers_end = time.monotonic() + answering
        while time.monotonic() < answers_end:
            workers.supervise()
            time.sleep(0.5)
        answers_stop.set()
        answerer.join(30)

        # Settle: wait while the runs make progress. Stop when all are final or waiting,
        # when nothing moved for 20 s (stuck: the check will say which runs), or at the cap.
        settle_start = time.monotonic()
        left = _unsettled()
        best, last_progress = left, settle_start
        while left and time.monotonic() - settle_start < settle:
            if time.monotonic() - last_progress > 20:
                break
            workers.supervise()
            time.sleep(1.0)
            left = _unsettled()
            if left < best:
                best, last_progress = left, time.monotonic()
        log(
            f"{left} runs not yet in a final or waiting state after "
            f"{time.monotonic() - settle_start:.0f} s"
        )
        # Let the sweeper take out in-progress idempotency records whose lease ran out.
        time.sleep(max(0.0, 6.0 - (time.monotonic() - settle_start)))
        workers.stop()

        import psycopg

        with psycopg.connect(cluster.url) as conn:
            checks = invariants.all_checks(
                conn,
                posts=book.posts,
                without_key=book.without_key,
                log=ctl.log,
                samples=samples,
                config_root=config_root,
                mail_dir=mail_dir,
            )
            counts = dict(
                conn.execute("SELECT status, count(*) FROM runs_run GROUP BY status").fetchall()
            )
            attempt_counts = dict(
                conn.execute("SELECT status, count(*) FROM runs_attempt GROUP BY status").fetchall()
            )
            stale = conn.execute(
                "SELECT count(*) FROM runs_attempt WHERE status = 'lost'"
            ).fetchone()[0]
        live_check = invariants.Check("no run has two live leases (sampled every second)")
        live_check.checked = len(samples)
        for run_id in sorted(set(live_overlaps)):
            live_check.bad(f"{run_id}: two running attempts with live leases at once")
        checks.insert(1, live_check)

        lines: list[str] = []
        say = lines.append
        say("")
        say(f"Chaos run, seed {opts.seed}: {time.monotonic() - started:.0f} s in all")
        say(
            table(
                ["what", "count"],
                [
                    ["runs created", sum(made.values())],
                    ["SIGKILL sent to workers", kills],
                    ["SIGSTOP/SIGCONT of workers", freezes],
                    ["worker processes started in all", workers.started],
                    ["workers that exited on their own", workers.unexpected_exits],
                    ["PostgreSQL restarts", cluster.restarts],
                    ["PostgreSQL restart took (s)", round(pg_restart_seconds or 0.0, 1)],
                    ["control requests sent", len(ctl.log)],
                    ["webhook POSTs received", sum(len(v) for v in book.posts.values())],
                    ["distinct webhook keys", len(book.posts)],
                    ["keys POSTed more than once", sum(len(v) > 1 for v in book.posts.values())],
                    [
                        "config-store versions written",
                        len(invariants.config_store_keys(config_root)),
                    ],
                    ["e-mails sent", len(invariants.mailed_keys(mail_dir)[0])],
                    [
                        "notification e-mails sent",
                        len(invariants.notification_mail_keys(mail_dir)),
                    ],
                    [
                        "notification webhook POSTs",
                        sum(
                            len(v)
                            for k, v in book.posts.items()
                            if invariants.is_notification_key(k)
                        ),
                    ],
                    ["attempts lost (lease ran out)", stale],
                ],
            )
        )
        say("\nRuns by status: " + json.dumps(counts, sort_keys=True))
        say("Attempts by status: " + json.dumps(attempt_counts, sort_keys=True))
        say("Duplicate patterns: " + json.dumps(dict(ctl.patterns), sort_keys=True))
        say("Answers: " + json.dumps(dict(sorted(ctl.statuses.items()))))
        say("")
        say(
            table(
                ["invariant", "checked", "violations"],
                [[c.name, c.checked, c.violations] for c in checks],
            )
        )
        bad = [c for c in checks if c.violations]
        for c in bad:
            say(f"\nVIOLATED: {c.name}")
            for example in c.examples:
                say(f"  {example}")
        if kills < kills_target:
            say(f"\nonly {kills} kills were sent (wanted {kills_target})")
        report = "\n".join(lines)
        print(report, flush=True)
        if opts.write_results or (opts.write_results is None and not opts.short):
            write_results(report, argv)
        result = {
            "seed": opts.seed,
            "short": opts.short,
            "seconds": round(time.monotonic() - started),
            "machine": machine(),
            "kills": kills,
            "freezes": freezes,
            "pg_restarts": cluster.restarts,
            "unexpected_worker_exits": workers.unexpected_exits,
            "runs": sum(made.values()),
            "runs_by_agent": dict(made),
            "remote_runs_by_status": _remote_statuses(),
            "control_requests": len(ctl.log),
            "webhook_posts": sum(len(v) for v in book.posts.values()),
            "runs_by_status": counts,
            "checks": {c.name: {"checked": c.checked, "violations": c.violations} for c in checks},
        }
        out = opts.result or (
            ROOT / "bench" / "results" / ("chaos-short.json" if opts.short else "chaos.json")
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"\nlogs in {logdir}")
        return 1 if bad else 0
    finally:
        if workers is not None:
            workers.stop()
        if web is not None:
            web.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                web.wait(10)
        if hook_server is not None:
            hook_server.shutdown()
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if os.environ.get("CHAOS_KEEP_PG"):
            log(f"kept PostgreSQL at {cluster.url}")
        else:
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
