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

Every write carries a fresh ``Idempotency-Key``, as holdpoint_client sends. The clients are
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
                             [--think 2] [--ramp 10] [--quick] [--keep]

Other PostgreSQL databases on the same server (and everything else on a shared machine)
count in "all postgres processes" and in the machine figure: read them next to the
"this database's backends" figure and the machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import random
import time
import uuid
from bisect import bisect_right
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.common import (
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

AGENT = "capacity"
CALLS = ("claim", "heartbeat", "checkpoint", "ask", "answer")
LEASE_SECONDS = 30.0  # heartbeat_seconds = lease / 3 = 10
HEARTBEAT_EVERY = 10.0
CHECKPOINT_EVERY = 5.0
ASK_EVERY = 60.0
CLAIM_WAIT = 20.0
TARGET_P99_MS = 50.0
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

    async def post(self, call: str, path: str, body: Any, **kw: Any) -> tuple[Any, str]:
        headers = {"Idempotency-Key": str(uuid.uuid4()), **kw.pop("headers", {})}
        sent = time.monotonic()
        t0 = time.perf_counter()
        try:
            client = self.people_client if call == "answer" else self.client
            response = await client.post(path, json=body, headers=headers, **kw)
        except Exception as exc:  # transport errors, timeouts: counted, never fatal
            elapsed = time.perf_counter() - t0
            self.rec.calls.append((call, sent, elapsed, f"transport {type(exc).__name__}"))
            return None, "transport"
        elapsed = time.perf_counter() - t0
        outcome, code = _outcome(response)
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
            async with lock:
                self.rec.lags.append((when, time.monotonic() - when))
                _, code = await self.post(
                    "heartbeat", f"{url}/heartbeat", {"lease_epoch": lease_epoch}
                )
            if code in LOST_LEASE_CODES:
                return

    async def attempt(self, lease: dict[str, Any]) -> None:
        """Run one attempt until its question (or until the lease is lost)."""
        url = f"/api/worker/attempts/{lease['attempt_id']}"
        epochs = {"lease_epoch": lease["lease_epoch"], "cancel_epoch": lease["cancel_epoch"]}
        lock = asyncio.Lock()
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
        async with lock:  # no heartbeat in flight; none after the attempt is over
            beating.cancel()
            self.rec.lags.append((ask_at, time.monotonic() - ask_at))
            response, code = await self.post("ask", f"{url}/interrupt", body)
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


async def _client_loop(plan: dict[str, Any], indices: list[int], rec: Recorder) -> None:
    import httpx

    bases: list[str] = plan["bases"]

    # One client per agent, as each remote agent has its own (and httpx's pool scans its
    # connections on every request: one pool of a thousand would cost the client, not the
    # server); two connections: the heartbeat beside the step's call.
    def client(base: str, connections: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=base,
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
    out.put((rec.calls, rec.leases, rec.answers, rec.lags, rec.loop_lags))


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
    intended = {
        "claim": n / (ASK_EVERY + think),
        "heartbeat": n * duty / HEARTBEAT_EVERY,
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
    return out


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
            servers = [
                stack.enter_context(web_server(opts.server, workers=opts.workers))
                for _ in range(opts.servers)
            ]
            _declare(servers[0].base, worker_token)
            print(f"preparing {n} queued runs ...", flush=True)
            t_prep = time.monotonic()
            for i in range(n):
                services.run_start(agent=AGENT, input={"i": i})
            print(f"  prepared in {time.monotonic() - t_prep:.1f} s", flush=True)
            connections.close_all()  # a forked child must never share a socket

            plan = {
                "agents": n,
                "bases": [s.base for s in servers],
                "worker_token": worker_token,
                "person_token": person_token,
                "think": opts.think,
                "ramp": opts.ramp,
                "seed": opts.seed,
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
        "server": opts.server,
        "workers": opts.workers,
        "client_procs": procs,
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
        f"{figures['client_procs']} client process(es), {figures['window_seconds']:.0f} s "
        f"measured after a {figures['ramp_seconds']:.0f} s ramp (think time "
        f"~{figures['think_seconds']:g} s)"
    )
    rows = []
    for call in CALLS:
        c = calls[call]
        s = c["latency_ms"]
        errors = ", ".join(f"{k} x{v}" for k, v in sorted(c["errors"].items())) or "-"
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
            ],
            rows,
        )
    )
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
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--quick", action="store_true", help="100 agents, 30 s")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    opts = parser.parse_args(argv)
    if opts.quick:
        opts.agents, opts.seconds = 100, 30.0
    figures = run(opts)
    report(figures)
    save_result("capacity", figures)
    return figures


if __name__ == "__main__":
    main()
