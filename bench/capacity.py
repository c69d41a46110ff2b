"""The capacity headline: web and PostgreSQL cores per 1,000 live remote agents.

N simulated remote agents speak the worker protocol over HTTP (docs/protocol.md) to K
web servers started as the Procfile's ``web`` line runs them (``bench.common.web_server``:
uvicorn with a worker process per core, a pool of 8 database connections each; --server
and --workers choose another); agent *i* talks to server *i mod K*. Each agent,
after a start staggered over ``--ramp`` seconds so the load is smooth:

- claims a run with a long-poll claim (``wait`` 20 s, lease 30 s, so ``heartbeat_seconds`` 10);
- saves a first checkpoint (a fresh attempt), then a checkpoint every 5 s and a heartbeat
  every 10 s;
- asks a question every 60 s (the first one at a random point of its first minute):
  ``interrupt`` ``input_required`` on its latest checkpoint; the attempt ends there;
- a simulated person answers after a think time (uniform 0.5-1.5 x ``--think``) over the
  person API, ``POST /api/runs/{id}/resume`` with a DRF token and an ``Idempotency-Key``;
  the agent's claim, waiting meanwhile, gets the resumed attempt (or another agent's:
  every agent serves the same declared agent, as a pool of workers does) and goes on.

Every write carries a fresh ``Idempotency-Key``, as holdpoint_client sends, and is sent
again with the same key as holdpoint_client does: after ``Retry-After`` (plus jitter) when
the server refuses it (429, 503, 409 ``idempotency_in_progress``), after a backoff when
the connection dropped under it (a transport error) or a 5xx other than 503 came back,
for up to ``RETRY_FOR`` seconds. Refusals and retries are counted apart from errors (an
error is a call that failed for good, or a 5xx other than 503, or a refusal without
``Retry-After`` and a problem ``code``); a call's latency runs from its first try to its
answer. The clients are
asyncio + httpx (HTTP/1.1 keep-alive, one pooled connection per agent) in
``--client-procs`` processes; the figures come from the measured window of ``--seconds``
after the ramp.

What is measured, per call (claim, heartbeat, checkpoint, ask, answer): count, rate next
to the rate the agents intend (achieved much below intended: the client or the server
could not keep up; the scheduling lag says which side), p50/p95/p99 latency and errors by
status and code. A claim's latency is not its long wait: it is the time from the moment
its attempt was due (the person's answer came back, or the claim was sent, whichever is
later) to the lease. CPU seconds over the window, as cores (CPU seconds / wall seconds),
from /proc/<pid>/stat (utime + stime): the web servers' processes; every ``postgres`` process
(plus the children the postmaster reaped: backends that ended); the backends of this
script's database only; ``redis-server`` (throttle counters); the client processes; and
the whole machine from /proc/stat. The headline: web and PostgreSQL cores per 1,000 live
agents. Target (issue 17): p99 of each call <= 50 ms.

    python -m bench.capacity [--agents 1000] [--seconds 300] [--servers 1] [--client-procs 1]
                             [--think 2] [--ramp 10] [--per-process 1] [--quick] [--keep]
                             [--topology]

``--topology`` starts the servers as web nodes of the multi-node topology instead
(bench/topology.py: nginx in front, PgBouncer in transaction pooling, two live nodes and a
worker node beside them) and every agent talks to nginx.

``--per-process K`` (K > 1): consecutive agents of a client process form worker processes
of K, each renewing all its agents' leases with one ``POST /api/worker/heartbeat`` every
10 s (docs/protocol.md §4) instead of a heartbeat per agent; the heartbeat row then counts
those batch calls (intended: one per worker process and interval).

Other PostgreSQL databases on the same server (and everything else on a shared machine)
count in "all postgres processes" and in the machine figure: read them next to the
"this database's backends" figure and the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import random
import ssl
import time
import uuid
from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    KEEP_ALIVE_SECONDS,
    Summary,
    add_server_arguments,
    database_name,
    ms,
    person,
    save_result,
    scratch_database,
    setup_django,
    table,
    verdict,
    web_server,
    with_database,
)
from bench.topology import topology_servers

AGENT = "capacity"
CALLS = ("claim", "heartbeat", "checkpoint", "ask", "answer")
LEASE_SECONDS = 30.0  # heartbeat_seconds = lease / 3 = 10
HEARTBEAT_EVERY = 10.0
CHECKPOINT_EVERY = 5.0
ASK_EVERY = 60.0
CLAIM_WAIT = 20.0
TARGET_P99_MS = 50.0
WEB_CORES_TARGET = 0.5  # per 1,000 live agents (issue 27)
POSTGRES_CORES_TARGET = 0.2
RETRY_FOR = 60.0  # seconds a call is tried again before it counts as failed
REFUSED = {429, 503}
LOST_LEASE_CODES = {"stale_worker", "not_your_lease", "stale_after_cancel", "not_found"}
ANSWER_SCHEMA = {"answer": "string"}


# --- The simulated agents (one asyncio loop per client process) -------------------------------


class Recorder:
    """What one client process saw; shipped to the parent at the end."""

    def __init__(self) -> None:
        # (call, sent at (monotonic), seconds, outcome)
        self.calls: list[tuple[str, float, float, str]] = []
        # A lease: (claim sent at, lease received at, run_id, reason)
        self.leases: list[tuple[float, float, str, str]] = []
        # An answer: (run_id, sent at, answered at), answered = the 202 came back
        self.answers: list[tuple[str, float, float]] = []
        # How late each timed call left after its scheduled time (seconds)
        self.lags: list[tuple[float, float]] = []
        # How late the event loop woke a 100 ms sleep: (when, seconds late)
        self.loop_lags: list[tuple[float, float]] = []
        # A refusal sent again later: (call, sent at, "<status> <code>", well formed), well
        # formed = Retry-After and a problem code
        self.refusals: list[tuple[str, float, str, bool]] = []
        # A try that got no answer, or a 5xx other than 503, sent again: (call, sent at, why)
        self.retries: list[tuple[str, float, str]] = []


def _backoff(tries: int) -> float:
    """holdpoint_client's backoff: 0.1 s doubling up to 5 s, drawn in its upper half."""
    ceiling = min(5.0, 0.1 * 2 ** min(tries - 1, 30))
    return random.uniform(ceiling / 2, ceiling)


def _outcome(response: Any) -> tuple[str, str]:
    """("ok" | "<status> <code>", code)."""
    if response.status_code < 400:
        return "ok", ""
    code = ""
    with contextlib.suppress(Exception):
        code = str(response.json().get("code") or "")
    return f"{response.status_code} {code}".strip(), code


class SimAgent:
    def __init__(
        self, index: int, client: Any, people: Any, plan: dict[str, Any], rec: Recorder
    ) -> None:
        self.index = index
        self.client = client  # the agent's own: two keep-alive connections
        self.people_client = people  # shared by the people who answer on its server
        self.plan = plan
        self.rec = rec
        self.rng = random.Random(plan["seed"] * 100_003 + index)
        self.worker_id = f"capacity-{index}"
        self.first_ask = True
        self.people: set[asyncio.Task[Any]] = set()
        # --per-process > 1: the worker process this agent runs in renews its lease
        # together with its neighbours' (one POST /api/worker/heartbeat per interval).
        self.group: WorkerProcess | None = None

    async def post(
        self,
        call: str,
        path: str,
        body: Any,
        *,
        lock: asyncio.Lock | None = None,
        answered: Callable[[], Any] | None = None,
        **kw: Any,
    ) -> tuple[Any, str]:
        """Send with a fresh key and again with the same key until answered (as the clients
        do), up to ``RETRY_FOR`` seconds; record the answer, the refusals and the retries.

        With ``lock``, each try holds it and the waits between tries do not, so that the
        calls sharing it (an attempt's heartbeats and its question) go on while one is
        refused; ``answered`` runs under the lock of the try that got the answer."""
        headers = {"Idempotency-Key": str(uuid.uuid4()), **kw.pop("headers", {})}
        sent = time.monotonic()
        t0 = time.perf_counter()
        client = self.people_client if call == "answer" else self.client
        tries = 0
        while True:
            tries += 1
            try:
                async with lock or contextlib.nullcontext():
                    response = await client.post(path, json=body, headers=headers, **kw)
                    status = response.status_code
                    outcome, code = _outcome(response)
                    in_progress = status == 409 and code == "idempotency_in_progress"
                    refused = status in REFUSED or in_progress
                    if not refused and status < 500 and answered is not None:
                        answered()
            except Exception as exc:  # transport errors, timeouts: sent again
                why = f"transport {type(exc).__name__}"
                self.rec.retries.append((call, sent, why))
                delay = _backoff(tries)
            else:
                if refused:
                    header = response.headers.get("retry-after", "")
                    self.rec.refusals.append((call, sent, outcome, header.isdigit() and bool(code)))
                    after = float(header) if header.isdigit() else 1.0
                    # Jitter: agents refused together do not all come back together.
                    delay = after + self.rng.uniform(0, after / 2)
                elif status >= 500:
                    why = outcome
                    self.rec.retries.append((call, sent, why))
                    delay = _backoff(tries)
                else:
                    break
                why = outcome
            if time.monotonic() + delay > sent + RETRY_FOR:
                elapsed = time.perf_counter() - t0
                self.rec.calls.append((call, sent, elapsed, f"gave up after {why}"))
                return None, "transport"
            await asyncio.sleep(delay)
        elapsed = time.perf_counter() - t0
        if response.status_code == 204:
            outcome = "204 nothing due"
        self.rec.calls.append((call, sent, elapsed, outcome))
        return response, code

    async def claim(self) -> dict[str, Any]:
        delay = 0.1
        while True:
            body = {
                "worker_id": self.worker_id,
                "agents": [AGENT],
                "lease_seconds": LEASE_SECONDS,
                "wait": CLAIM_WAIT,
            }
            sent = time.monotonic()
            response, _ = await self.post(
                "claim", "/api/worker/claim", body, timeout=CLAIM_WAIT + 15
            )
            if response is not None and response.status_code == 200:
                lease = response.json()
                self.rec.leases.append((sent, time.monotonic(), lease["run_id"], lease["reason"]))
                return lease
            if response is not None and response.status_code == 204:
                delay = 0.1
                continue
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def answer(self, request: dict[str, Any]) -> None:
        think = self.plan["think"] * self.rng.uniform(0.5, 1.5)
        await asyncio.sleep(think)
        run_id = request["run_id"]
        body = {
            "request_id": request["request_id"],
            "checkpoint_id": request["checkpoint_id"],
            "value": {"answer": "go on"},
        }
        sent = time.monotonic()
        response, _ = await self.post(
            "answer",
            f"/api/runs/{run_id}/resume",
            body,
            headers={"Authorization": f"Token {self.plan['person_token']}"},
        )
        if response is not None and response.status_code == 202:
            self.rec.answers.append((run_id, sent, time.monotonic()))

    async def heartbeats(self, url: str, lease_epoch: int, lock: asyncio.Lock) -> None:
        """Renew the lease every 10 s beside the steps, as the client's heartbeat thread
        does; ``lock`` keeps a renewal from crossing the question that ends the attempt."""
        when = time.monotonic()
        while True:
            when += HEARTBEAT_EVERY
            await asyncio.sleep(max(0.0, when - time.monotonic()))
            self.rec.lags.append((when, time.monotonic() - when))
            _, code = await self.post(
                "heartbeat", f"{url}/heartbeat", {"lease_epoch": lease_epoch}, lock=lock
            )
            if code in LOST_LEASE_CODES:
                return

    async def attempt(self, lease: dict[str, Any]) -> None:
        """Run one attempt until its question (or until the lease is lost)."""
        url = f"/api/worker/attempts/{lease['attempt_id']}"
        epochs = {"lease_epoch": lease["lease_epoch"], "cancel_epoch": lease["cancel_epoch"]}
        lock = asyncio.Lock()
        if self.group is not None:
            beating = asyncio.create_task(
                self.group.hold(lease["attempt_id"], epochs["lease_epoch"])
            )
        else:
            beating = asyncio.create_task(self.heartbeats(url, epochs["lease_epoch"], lock))
        try:
            await self.steps(url, epochs, lease.get("resume_from"), lock, beating)
        finally:
            beating.cancel()

    async def steps(
        self,
        url: str,
        epochs: dict[str, int],
        resume: dict[str, Any] | None,
        lock: asyncio.Lock,
        beating: asyncio.Task[None],
    ) -> None:
        n = 0
        if resume:
            checkpoint_id = resume["checkpoint_id"]
            n = int((resume.get("state") or {}).get("n", 0))
        else:
            response, code = await self.post(
                "checkpoint", f"{url}/checkpoint", {**epochs, "step": "work", "state": {"n": 0}}
            )
            if response is None or response.status_code != 201:
                return
            checkpoint_id = response.json()["checkpoint_id"]
        start = time.monotonic()
        # The first question after 10, 20 ... 60 s (whole heartbeat periods, so that every
        # cycle keeps its heartbeats), then every 60 s.
        ask_at = start + (HEARTBEAT_EVERY * self.rng.randint(1, 6) if self.first_ask else ASK_EVERY)
        self.first_ask = False
        when = start
        while True:
            when += CHECKPOINT_EVERY
            if when > ask_at:
                break
            await asyncio.sleep(max(0.0, when - time.monotonic()))
            self.rec.lags.append((when, time.monotonic() - when))
            n += 1
            state = {"n": n, "note": f"step {n} of agent {self.index}"}
            response, code = await self.post(
                "checkpoint", f"{url}/checkpoint", {**epochs, "step": "work", "state": state}
            )
            if code in LOST_LEASE_CODES or beating.done():
                return
            if response is not None and response.status_code == 201:
                checkpoint_id = response.json()["checkpoint_id"]
        await asyncio.sleep(max(0.0, ask_at - time.monotonic()))
        body = {
            **epochs,
            "checkpoint_id": checkpoint_id,
            "kind": "input_required",
            "prompt": f"Go on after step {n}?",
            "accepted_schema": ANSWER_SCHEMA,
            "step_id": f"work.q{n}",
        }
        # The lease is renewed until the question is answered, as holdpoint_client's
        # heartbeat goes on until its attempt returns: a question refused for longer than
        # the lease must not lose it. Each try holds ``lock`` (no heartbeat crosses it), and
        # the try that is answered stops the renewals before it lets go (none after the
        # attempt is over).
        self.rec.lags.append((ask_at, time.monotonic() - ask_at))
        response, code = await self.post(
            "ask", f"{url}/interrupt", body, lock=lock, answered=beating.cancel
        )
        if response is not None and response.status_code == 201:
            task = asyncio.create_task(self.answer(response.json()))
            self.people.add(task)
            task.add_done_callback(self.people.discard)
        # Not asked (an error): the attempt is given up; its lease runs out.

    async def live(self, start_at: float) -> None:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        while True:
            lease = await self.claim()
            await self.attempt(lease)


class WorkerProcess:
    """``--per-process K``: K agents in one worker process, whose one heartbeat loop renews
    all the attempts they hold with one ``POST /api/worker/heartbeat`` every 10 s, as
    holdpoint_client does with ``--concurrency K``. An attempt whose entry is refused
    (lease lost) ends its ``hold`` task, which stops its agent's steps."""

    def __init__(self, client: Any, rec: Recorder) -> None:
        self.client = client
        self.rec = rec
        self.held: dict[str, tuple[int, asyncio.Event]] = {}

    async def hold(self, attempt_id: str, lease_epoch: int) -> None:
        lost = asyncio.Event()
        self.held[attempt_id] = (lease_epoch, lost)
        try:
            await lost.wait()
        finally:
            self.held.pop(attempt_id, None)

    async def live(self, start_at: float) -> None:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        when = time.monotonic()
        while True:
            when += HEARTBEAT_EVERY
            await asyncio.sleep(max(0.0, when - time.monotonic()))
            held = dict(self.held)
            if not held:
                continue
            self.rec.lags.append((when, time.monotonic() - when))
            body = {
                "attempts": [
                    {"attempt_id": attempt_id, "lease_epoch": epoch}
                    for attempt_id, (epoch, _lost) in held.items()
                ]
            }
            sent = time.monotonic()
            t0 = time.perf_counter()
            try:
                response = await self.client.post("/api/worker/heartbeat", json=body)
            except Exception as exc:
                elapsed = time.perf_counter() - t0
                self.rec.calls.append(
                    ("heartbeat", sent, elapsed, f"transport {type(exc).__name__}")
                )
                continue
            elapsed = time.perf_counter() - t0
            outcome, _code = _outcome(response)
            self.rec.calls.append(("heartbeat", sent, elapsed, outcome))
            if response.status_code != 200:
                continue
            for answer in response.json()["attempts"]:
                code = (answer.get("problem") or {}).get("code")
                if code in LOST_LEASE_CODES and answer["attempt_id"] in held:
                    held[answer["attempt_id"]][1].set()
                    # A lease lost inside a 200: counted with the heartbeats' errors.
                    status = answer["problem"].get("status", 409)
                    self.rec.calls.append(
                        ("heartbeat", sent, elapsed, f"{status} {code} (in a batch)")
                    )


async def _client_loop(plan: dict[str, Any], indices: list[int], rec: Recorder) -> None:
    import httpx

    bases: list[str] = plan["bases"]

    # One client per agent, as each remote agent has its own (and httpx's pool scans its
    # connections on every request: one pool of a thousand would cost the client, not the
    # server); two connections: the heartbeat beside the step's call.
    # One TLS context for all (the bases are http://): httpx builds one per client otherwise,
    # some 20 ms of CPU each, and a thousand of them took the load generator's whole window.
    tls = ssl.create_default_context()

    def client(base: str, connections: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=base,
            verify=tls,
            headers={"Authorization": f"Bearer {plan['worker_token']}"},
            timeout=30,
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

    people = {s: client(bases[s], 32) for s in {i % len(bases) for i in indices}}
    t0, ramp, end = plan["t0"], plan["ramp"], plan["end"]
    n = plan["agents"]
    agents = [
        SimAgent(i, client(bases[i % len(bases)], 2), people[i % len(bases)], plan, rec)
        for i in indices
    ]
    clients = [a.client for a in agents] + list(people.values())
    tasks = [asyncio.create_task(a.live(t0 + ramp * a.index / n)) for a in agents]
    per = plan.get("per_process", 1)
    if per > 1:
        # Consecutive agents of this client process share a worker process (and its
        # heartbeat connection); its loop starts with its first agent.
        for at in range(0, len(agents), per):
            members = agents[at : at + per]
            group = WorkerProcess(client(bases[members[0].index % len(bases)], 2), rec)
            for agent in members:
                agent.group = group
            clients.append(group.client)
            tasks.append(asyncio.create_task(group.live(t0 + ramp * members[0].index / n)))
    while (left := end - time.monotonic()) > 0:
        when = time.monotonic() + min(0.1, left)
        await asyncio.sleep(min(0.1, left))
        rec.loop_lags.append((when, time.monotonic() - when))
    for task in tasks:
        task.cancel()
    for agent in agents:
        for task in list(agent.people):
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for each in clients:
        with contextlib.suppress(Exception):
            await each.aclose()


def _client_main(
    plan: dict[str, Any], indices: list[int], ready: Any, go: Any, times: Any, out: Any
) -> None:
    import httpx  # noqa: F401  (imported before the clock starts)

    ready.put(os.getpid())
    go.wait()
    rec = Recorder()
    asyncio.run(_client_loop({**plan, "t0": times[0], "end": times[1]}, indices, rec))
    out.put(
        (rec.calls, rec.leases, rec.answers, rec.lags, rec.loop_lags, rec.refusals, rec.retries)
    )


# --- CPU ---------------------------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: str | int) -> tuple[str, list[str]] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, tail = text.rsplit(")", 1)
    return head.split("(", 1)[1], tail.split()


def processes_cpu_seconds(comm: str) -> float:
    """utime + stime of every process named ``comm``, plus the children each reaped
    (cutime + cstime: the postmaster's ended backends)."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _stat(entry.name)
        if stat is None or stat[0] != comm:
            continue
        fields = stat[1]
        ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks / CLOCK_TICKS


def pids_cpu_seconds(pids: list[int]) -> dict[int, float]:
    out = {}
    for pid in pids:
        stat = _stat(pid)
        if stat is not None:
            out[pid] = (int(stat[1][11]) + int(stat[1][12])) / CLOCK_TICKS
    return out


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent not idle (all cores), from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / CLOCK_TICKS


class Snapshot:
    def __init__(self, servers: list[Any], client_pids: list[int], admin: Any, db: str) -> None:
        self.t = time.monotonic()
        self.web = sum(server.cpu_seconds() for server in servers)  # their worker processes too
        self.clients = sum(pids_cpu_seconds(client_pids).values())
        self.pg_all = processes_cpu_seconds("postgres")
        backends = [
            int(row[0])
            for row in admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", [db]
            ).fetchall()
        ]
        self.pg_db = pids_cpu_seconds(backends)
        self.redis = processes_cpu_seconds("redis-server")
        self.machine = machine_busy_seconds()


def cpu_figures(before: Snapshot, after: Snapshot, agents: int) -> dict[str, dict[str, float]]:
    wall = after.t - before.t
    common = set(before.pg_db) & set(after.pg_db)
    used = {
        "web": after.web - before.web,
        "PostgreSQL, all postgres processes": after.pg_all - before.pg_all,
        "PostgreSQL, this database's backends": sum(
            after.pg_db[p] - before.pg_db[p] for p in common
        ),
        "Redis (redis-server)": after.redis - before.redis,
        "load generator (client processes)": after.clients - before.clients,
        "whole machine (all processes)": after.machine - before.machine,
    }
    return {
        name: {
            "cpu_seconds": round(seconds, 2),
            "cores": round(seconds / wall, 3),
            "cores_per_1000_agents": round(seconds / wall * 1000 / agents, 3),
        }
        for name, seconds in used.items()
    }


# --- Figures -----------------------------------------------------------------------------------


def call_figures(
    gathered: list[tuple[Any, ...]], w0: float, w1: float, plan: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    calls = [c for g in gathered for c in g[0]]
    leases = [lease for g in gathered for lease in g[1]]
    answers: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for g in gathered:
        for run_id, sent, received in g[2]:
            answers[run_id].append((sent, received))
    for values in answers.values():
        values.sort()
    wall = w1 - w0
    n, think = plan["agents"], plan["think"]
    duty = ASK_EVERY / (ASK_EVERY + think)
    per = plan.get("per_process", 1)
    intended = {
        "claim": n / (ASK_EVERY + think),
        # --per-process K: one batch per worker process (of K agents) and interval.
        "heartbeat": (n * duty if per <= 1 else -(-n // per)) / HEARTBEAT_EVERY,
        "checkpoint": n * duty / CHECKPOINT_EVERY,
        "ask": n / (ASK_EVERY + think),
        "answer": n / (ASK_EVERY + think),
    }
    latencies: dict[str, list[float]] = defaultdict(list)
    outcomes: dict[str, Counter[str]] = defaultdict(Counter)
    for call, sent, seconds, outcome in calls:
        if not w0 <= sent < w1:
            continue
        outcomes[call][outcome] += 1
        if call != "claim" and outcome == "ok":
            latencies[call].append(seconds)
    # A claim's latency: from the moment its attempt was due to the lease.
    for sent, received, run_id, reason in leases:
        if not w0 <= received < w1:
            continue
        due = sent
        if reason == "resume":
            times = answers.get(run_id, [])
            i = bisect_right(times, (received, float("inf")))
            if i:
                due = max(sent, times[i - 1][1])
        latencies["claim"].append(max(0.0, received - due))
    out: dict[str, dict[str, Any]] = {}
    for call in CALLS:
        summary = Summary.of(ms(latencies[call]))
        count = summary.n
        errors = {k: v for k, v in outcomes[call].items() if k not in ("ok", "204 nothing due")}
        out[call] = {
            "count": count,
            "per_s": round(count / wall, 2),
            "intended_per_s": round(intended[call], 2),
            "achieved": round(count / wall / intended[call], 3) if intended[call] else None,
            "latency_ms": summary.as_dict(),
            "errors": errors,
        }
        if call == "claim":
            out[call]["answered_204"] = outcomes[call].get("204 nothing due", 0)
    for call in CALLS:
        refused: Counter[str] = Counter()
        retried: Counter[str] = Counter()
        for g in gathered:
            for what, sent, outcome, well_formed in g[5]:
                if what == call and w0 <= sent < w1:
                    refused[outcome] += 1
                    if not well_formed:
                        # A refusal without Retry-After and a problem code is an error.
                        out[call]["errors"][f"{outcome} without Retry-After or code"] = (
                            out[call]["errors"].get(f"{outcome} without Retry-After or code", 0) + 1
                        )
            for what, sent, why in g[6]:
                if what == call and w0 <= sent < w1:
                    retried[why] += 1
                    if not why.startswith("transport"):
                        # A 5xx other than 503, even if a retry then succeeded, is an error.
                        out[call]["errors"][why] = out[call]["errors"].get(why, 0) + 1
        out[call]["refused"] = dict(refused)
        out[call]["retried"] = dict(retried)
    return out


def lost_leases(calls: dict[str, dict[str, Any]]) -> int:
    """How many live agents' leases were lost: writes answered ``stale_worker`` (or its
    kin), on their own or inside a batch heartbeat (``call_figures``' errors). Nothing in
    this benchmark cancels, so each is a lease the server took back from a live agent."""
    return sum(
        n
        for call in CALLS
        for outcome, n in calls[call]["errors"].items()
        if outcome.split(" ")[1:2] and outcome.split(" ")[1] in LOST_LEASE_CODES
    )


def lag_figures(gathered: list[tuple[Any, ...]], w0: float, w1: float) -> dict[str, Any]:
    """How late the agents' timed calls left (behind their own slow calls, or a busy loop)
    and how late each client's event loop woke from a 100 ms sleep (a busy loop only)."""
    calls = [lag for g in gathered for when, lag in g[3] if w0 <= when < w1]
    loops = [lag for g in gathered for when, lag in g[4] if w0 <= when < w1]
    return {
        "timed_calls": Summary.of(ms(calls)).as_dict(),
        "event_loop": Summary.of(ms(loops)).as_dict(),
    }


# --- Main --------------------------------------------------------------------------------------


def _declare(base: str, token: str) -> None:
    import httpx
    from holdpoint_client import Agent

    body = Agent(name=AGENT, description="bench.capacity simulated agent").declaration()
    body = {k: v for k, v in body.items() if v not in (None, {}) or k == "input_schema"}
    response = httpx.put(
        f"{base}/api/agents/{AGENT}",
        json=body,
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4())},
        timeout=30,
    )
    response.raise_for_status()


def run(opts: argparse.Namespace) -> dict[str, Any]:
    import psycopg

    n, procs = opts.agents, max(1, min(opts.client_procs, opts.agents))
    with scratch_database("capacity", keep=opts.keep) as url:
        setup_django()
        from django.db import connections

        from runs import services
        from runs.tokens import worker_token_create

        _, person_token = person("capacity-person", "operator")
        _, worker_token = worker_token_create(name="capacity")
        with contextlib.ExitStack() as stack:
            # Every simulated agent shares one token from one address, where a deployment
            # has a token and an address per host: the caps on waiting claims per token
            # and per address (docs/security.md) would count them as one greedy host.
            uncapped = {
                "HOLDPOINT_WAITING_CLAIMS_PER_TOKEN": "0",
                "HOLDPOINT_WAITING_CLAIMS_PER_ADDRESS": "0",
                "WEB_KEEP_ALIVE": str(opts.keep_alive),
            }
            if opts.topology:  # bench/topology.py: every agent through nginx
                servers, bases = topology_servers(stack, url, opts.servers, opts.workers, uncapped)
            else:
                servers = [
                    stack.enter_context(
                        web_server(
                            opts.server,
                            workers=opts.workers,
                            env=uncapped,
                            log=Path(opts.server_log) if opts.server_log else None,
                        )
                    )
                    for _ in range(opts.servers)
                ]
                bases = [s.base for s in servers]
            _declare(bases[0], worker_token)
            print(f"preparing {n} queued runs ...", flush=True)
            t_prep = time.monotonic()
            for i in range(n):
                services.run_start(agent=AGENT, input={"i": i})
            print(f"  prepared in {time.monotonic() - t_prep:.1f} s", flush=True)
            connections.close_all()  # a forked child must never share a socket

            plan = {
                "agents": n,
                "bases": bases,
                "worker_token": worker_token,
                "person_token": person_token,
                "think": opts.think,
                "ramp": opts.ramp,
                "seed": opts.seed,
                "per_process": opts.per_process,
            }
            ctx = mp.get_context("fork")
            ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
            times = ctx.Array("d", 2)
            children = [
                ctx.Process(
                    target=_client_main,
                    args=(plan, list(range(p, n, procs)), ready, go, times, out),
                )
                for p in range(procs)
            ]
            for child in children:
                child.start()
            client_pids = [ready.get(timeout=60) for _ in children]
            t0 = time.monotonic() + 0.5
            w0, w1 = t0 + opts.ramp, t0 + opts.ramp + opts.seconds
            times[0], times[1] = t0, w1
            go.set()
            print(
                f"{n} agents on {len(servers)} server(s) from {procs} client process(es): "
                f"{opts.ramp:.0f} s ramp, then {opts.seconds:.0f} s measured",
                flush=True,
            )
            db = database_name(url)
            with psycopg.connect(with_database(url, "postgres"), autocommit=True) as admin:
                time.sleep(max(0.0, w0 - time.monotonic()))
                before = Snapshot(servers, client_pids, admin, db)
                time.sleep(max(0.0, w1 - time.monotonic()))
                after = Snapshot(servers, client_pids, admin, db)
            gathered = [out.get(timeout=120) for _ in children]
            for child in children:
                child.join(timeout=30)
    return {
        "agents": n,
        "seconds": opts.seconds,
        "ramp_seconds": opts.ramp,
        "servers": opts.servers,
        "server": "topology (nginx, PgBouncer)" if opts.topology else opts.server,
        "workers": opts.workers,
        "client_procs": procs,
        "keep_alive_seconds": opts.keep_alive,
        "max_inflight": os.environ.get("HOLDPOINT_WEB_MAX_INFLIGHT", "64 (default)"),
        "per_process": opts.per_process,
        "think_seconds": opts.think,
        "window_seconds": round(after.t - before.t, 2),
        "calls": call_figures(gathered, w0, w1, plan),
        "lag_ms": lag_figures(gathered, w0, w1),
        "cpu": cpu_figures(before, after, n),
    }


def report(figures: dict[str, Any]) -> None:
    n = figures["agents"]
    calls, cpu, lags = figures["calls"], figures["cpu"], figures["lag_ms"]
    lag, loop = lags["timed_calls"], lags["event_loop"]
    print(
        f"\nCapacity: {n} live remote agents, {figures['servers']} x {figures['server']} "
        f"({figures['workers']} process(es) each), "
        f"{figures['client_procs']} client process(es), "
        f"{figures.get('per_process', 1)} agent(s) per worker process, "
        f"{figures['window_seconds']:.0f} s "
        f"measured after a {figures['ramp_seconds']:.0f} s ramp (think time "
        f"~{figures['think_seconds']:g} s)"
    )
    rows = []
    for call in CALLS:
        c = calls[call]
        s = c["latency_ms"]
        errors = ", ".join(f"{k} x{v}" for k, v in sorted(c["errors"].items())) or "-"
        refused = ", ".join(f"{k} x{v}" for k, v in sorted(c["refused"].items())) or "-"
        retried = ", ".join(f"{k} x{v}" for k, v in sorted(c["retried"].items())) or "-"
        rows.append(
            [
                call,
                c["count"],
                c["per_s"],
                c["intended_per_s"],
                f"{c['achieved'] * 100:.0f} %" if c["achieved"] is not None else "-",
                s["p50"],
                s["p95"],
                s["p99"],
                s["max"],
                errors,
                refused,
                retried,
            ]
        )
    print(
        table(
            [
                "call",
                "count",
                "per s",
                "intended per s",
                "achieved",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "max ms",
                "errors",
                "refused, sent again",
                "dropped or 5xx, sent again",
            ],
            rows,
        )
    )
    totals = {
        what: sum(sum(calls[call][what].values()) for call in CALLS)
        for what in ("errors", "refused", "retried")
    }
    figures["totals"] = totals
    leases_lost = lost_leases(calls)
    figures["leases_lost"] = leases_lost
    print(
        f"errors {totals['errors']}; refused (429/503/409 in progress, sent again after "
        f"Retry-After) {totals['refused']}; dropped connections or 5xx sent again with the "
        f"same key {totals['retried']}"
    )
    print(f"leases lost by live agents (409 stale_worker and its kin): {leases_lost}")
    print(
        f"claims answered 204 (nothing due within {CLAIM_WAIT:.0f} s): "
        f"{calls['claim']['answered_204']}; a claim's latency runs from the moment its "
        "attempt was due (answer received, or claim sent) to the lease"
    )
    print(
        f"lag behind schedule: the agents' timed calls p50 {lag['p50']:.1f} ms, p99 "
        f"{lag['p99']:.1f} ms, max {lag['max']:.1f} ms; the clients' event loops p99 "
        f"{loop['p99']:.1f} ms, max {loop['max']:.1f} ms"
    )
    print(
        table(
            ["CPU over the window", "CPU s", "cores", "cores per 1,000 agents"],
            [
                [
                    k,
                    v["cpu_seconds"],
                    v["cores"],
                    float("nan") if k.startswith("whole") else v["cores_per_1000_agents"],
                ]
                for k, v in cpu.items()
            ],
        )
    )
    web = cpu["web"]["cores_per_1000_agents"]
    pg = cpu["PostgreSQL, all postgres processes"]["cores_per_1000_agents"]
    pg_db = cpu["PostgreSQL, this database's backends"]["cores_per_1000_agents"]
    print(
        f"Headline: {web:.2f} web cores per 1,000 live agents; {pg:.2f} PostgreSQL cores per "
        f"1,000 live agents (this database's backends alone: {pg_db:.2f})"
    )
    behind = [
        call for call in ("heartbeat", "checkpoint", "ask") if (calls[call]["achieved"] or 0) < 0.9
    ]
    client_cores = cpu["load generator (client processes)"]["cores"] / figures["client_procs"]
    machine_cores = cpu["whole machine (all processes)"]["cores"]
    client_bound = client_cores > 0.85
    saturated = machine_cores >= 0.9 * (os.cpu_count() or 1)
    late = lag["p99"] > 250 or loop["p99"] > 50
    facts = (
        f"timed calls late p99 {lag['p99']:.0f} ms; event loop late p99 {loop['p99']:.0f} ms; "
        f"{client_cores:.2f} cores per client process; the machine {machine_cores:.2f} of "
        f"{os.cpu_count()} cores busy"
    )
    if behind or late or client_bound:
        why = []
        if client_bound:
            why.append("the load generator near one core per process (add --client-procs)")
        if saturated:
            why.append("the machine's cores all busy (the clients wait for a core)")
        if behind and not client_bound:
            why.append("the server (slow answers hold the agents back)")
        if totals["refused"]:
            why.append(
                f"the server refused {totals['refused']} calls (503/429: past what it serves; "
                "each sent again after Retry-After)"
            )
        print(
            f"NOT KEEPING UP: below 90 % of the intended rate: {', '.join(behind) or 'none'}; "
            f"{facts}; likely: {'; '.join(why) or 'unclear'}"
        )
    else:
        print(f"keeping up: every timed call at >= 90 % of its intended rate; {facts}")
    figures["keeping_up"] = not (behind or late or client_bound)
    figures["machine_saturated"] = saturated
    missed = [call for call in CALLS if not calls[call]["latency_ms"]["p99"] <= TARGET_P99_MS]
    ok = not missed
    print(
        f"Verdict: p99 of each call <= {TARGET_P99_MS:.0f} ms: {verdict(ok)}"
        + (f" ({', '.join(missed)})" if missed else "")
    )
    figures["verdict_p99_le_50ms"] = ok
    figures["headline"] = {
        "web_cores_per_1000_agents": web,
        "postgresql_cores_per_1000_agents": pg,
        "postgresql_db_backends_cores_per_1000_agents": pg_db,
    }
    # What `make bench` lists (bench.all.targets): issue 27's targets, judged in this run.
    kept = "kept up with" if figures["keeping_up"] else "did NOT keep up with"
    worst = max(calls[call]["latency_ms"]["p99"] for call in CALLS)
    figures["targets"] = [
        f"{figures['agents']} agents: web {web:.2f} cores per 1,000 live agents "
        f"({verdict(web <= WEB_CORES_TARGET)} <= {WEB_CORES_TARGET}), PostgreSQL {pg:.2f} "
        f"({verdict(pg <= POSTGRES_CORES_TARGET)} <= {POSTGRES_CORES_TARGET}); the load "
        f"generator {kept} the intended rate",
        f"{figures['agents']} agents: worst p99 of a call {worst:.0f} ms ({verdict(ok)} <= "
        f"{TARGET_P99_MS:.0f} ms), errors {totals['errors']} ({verdict(totals['errors'] == 0)} "
        f"= 0), {totals['refused']} refused with Retry-After",
        f"{figures['agents']} agents, {calls['checkpoint']['achieved'] or 0:.0%} of the intended "
        f"checkpoints served: leases lost by live agents {leases_lost} "
        f"({verdict(leases_lost == 0)} = 0)",
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000, help="live agents (default 1000)")
    parser.add_argument(
        "--seconds", type=float, default=300, help="measured seconds after the ramp (300)"
    )
    parser.add_argument(
        "--servers", type=int, default=1, help="web servers on their own ports (default 1)"
    )
    add_server_arguments(parser, workers_help="processes per server")
    parser.add_argument(
        "--client-procs", type=int, default=1, help="load-generator processes (default 1)"
    )
    parser.add_argument(
        "--think", type=float, default=2.0, help="a person's mean think time, s (default 2)"
    )
    parser.add_argument(
        "--ramp", type=float, default=10.0, help="agents' starts spread over s (default 10)"
    )
    parser.add_argument(
        "--topology",
        action="store_true",
        help="--servers web nodes of --workers processes behind nginx, over PgBouncer, "
        "with two live nodes and a worker node (bench/topology.py)",
    )
    parser.add_argument(
        "--per-process",
        type=int,
        default=1,
        help="agents per worker process: above 1, each process renews its agents' leases "
        "with one POST /api/worker/heartbeat per interval (default 1: each agent its own)",
    )
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--quick", action="store_true", help="100 agents, 30 s")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument(
        "--keep-alive",
        type=int,
        default=KEEP_ALIVE_SECONDS,
        help=f"uvicorn's --timeout-keep-alive, s (the Procfile's: {KEEP_ALIVE_SECONDS})",
    )
    parser.add_argument(
        "--server-log", default="", help="append the web servers' output (tracebacks) here"
    )
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.agents, opts.seconds = 100, 30.0
    figures = run(opts)
    report(figures)
    if opts.topology:  # beside the single-node figures, not over them
        path = save_result("capacity_topology", figures)
        saved = json.loads(path.read_text())
        saved["command"] = saved["command"].replace("bench.capacity_topology", "bench.capacity")
        path.write_text(json.dumps(saved, indent=2, default=str) + "\n")
    else:
        save_result("capacity", figures)
    return figures


if __name__ == "__main__":
    main()
