"""The Python peer, side by side: Holdpoint's web tier against Prefect 3's server.

Both servers run at once on the same PostgreSQL, each in its own scratch database,
and are driven one after the other by the same client code (``http_client``: httpx
keep-alive clients in 1 and 4 processes, ``bench.load.run_load``):

- cancel. Holdpoint: ``POST /api/runs/{id}/cancel`` with a fresh ``Idempotency-Key`` on a
  queued run (it ends ``cancelled``), the web server as the Procfile's ``web`` line runs it
  (uvicorn, a worker process per core, a psycopg pool of 8 each; ``--server`` and
  ``--workers`` choose another), DRF token auth.
  Prefect: ``POST /api/flow_runs/{id}/set_state`` with ``{"state": {"type": "CANCELLING",
  "name": "Cancelling"}, "force": false}`` on a deployment-free flow run created beforehand.
  By default the run is SCHEDULED, which is what a queued run is to Prefect: its
  orchestration policy (``BypassCancellingFlowRunsWithNoInfra``) turns the proposed
  CANCELLING into CANCELLED, as Holdpoint's cancel of a queued run ends it.
  ``--prefect-from running`` cancels RUNNING flow runs instead: the CANCELLING state is
  accepted and stays (no worker is there to finish it).
- read. Holdpoint ``GET /api/runs/{id}``; Prefect ``GET /api/flow_runs/{id}``, on the runs
  just cancelled.

Prefect runs from its own venv (``scripts/prefect-venv`` builds ``var/prefect-venv``;
never the project's), as ``prefect server start`` in the foreground: one process, uvicorn,
no authentication, SQLAlchemy's default pool (5 + 10 overflow), log level WARNING (no
access log). Its UI and analytics are off, and so (``--prefect-services events``, the
default) are the loop services that have nothing to do in this run or would change its
flow runs: scheduler, late runs (it would turn the SCHEDULED runs Late), foreman,
cancellation cleanup, pause expirations, repossessor, cleanup reconciler, triggers and
actions (no automations), task-run recorder (no task runs), the events stream-out.
The event persister stays on: every state change emits an event that Prefect writes to
its ``events`` table (in batches, up to 5 s later), its record of the change, as
Holdpoint writes run events in the cancel's transaction. ``--prefect-services default``
keeps whatever Prefect enables by default; ``none`` runs it ``--no-services``.

Each operation's requests are dealt into two halves and the servers are driven A B B A
(Holdpoint, Prefect, Prefect, Holdpoint), so that a change in the shared machine's load
falls on both; throughput is operations over the summed wall time of a server's halves.
Server CPU per operation: user + system time from /proc of each server's process and
every descendant (Prefect's foreground server does not fork; the sum is there in case it
does), read before the first half and after a trailing ``--settle`` seconds (default 6:
Prefect's event persister flushes every 5 s), less that server's idle CPU rate (measured
beforehand) over the whole window. The same rule for both servers.

Targets (issue 17): Holdpoint >= 2x Prefect's throughput and <= 1/2 of its CPU per
operation.

    python -m bench.prefect_peer [--clients 1,4] [--requests 200] [--prefect-from scheduled]
                                 [--prefect-services events] [--settle 6] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    _admin_connect,
    add_server_arguments,
    base_database_url,
    database_name,
    declare_bench_agent,
    free_port,
    parse_int_list,
    person,
    save_result,
    scratch_database,
    setup_django,
    stop_process,
    table,
    verdict,
    wait_for_http,
    web_server,
    with_database,
)
from bench.load import LoadResult, Record, run_load, split

SETTINGS_BASE = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_UI_ENABLED": "false",
    "PREFECT_SERVER_UI_ENABLED": "false",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_METRICS_ENABLED": "false",
}
# Loop services with nothing to do here, or that would change the benchmark's flow runs.
SERVICES_OFF = [
    "SCHEDULER",
    "LATE_RUNS",
    "FOREMAN",
    "CANCELLATION_CLEANUP",
    "PAUSE_EXPIRATIONS",
    "REPOSSESSOR",
    "CLEANUP_RECONCILER",
    "TRIGGERS",
    "TASK_RUN_RECORDER",
    "EVENT_LOGGER",
]


def prefect_python() -> str:
    """The Prefect venv's python (built by scripts/prefect-venv when missing), or exit."""
    script = ROOT / "scripts" / "prefect-venv"
    print("checking the Prefect venv (scripts/prefect-venv) ...", flush=True)
    proc = subprocess.run([str(script)], cwd=ROOT, capture_output=True, text=True)
    python = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    if proc.returncode != 0 or not python or not Path(python).exists():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        sys.exit(
            "bench.prefect_peer: cannot build Prefect's venv with scripts/prefect-venv "
            f"(exit {proc.returncode}); the peer cannot run.\n{tail}"
        )
    return python


def prefect_versions(python: str) -> dict[str, str]:
    code = (
        "import json, prefect, sqlalchemy, asyncpg, fastapi, uvicorn, sys;"
        "print(json.dumps({'prefect': prefect.__version__, 'sqlalchemy': sqlalchemy.__version__,"
        " 'asyncpg': asyncpg.__version__, 'fastapi': fastapi.__version__,"
        " 'uvicorn': uvicorn.__version__, 'python': sys.version.split()[0]}))"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def holdpoint_versions() -> dict[str, str]:
    from importlib.metadata import version

    return {
        name: version(name)
        for name in ("django", "uvicorn", "daphne", "psycopg", "djangorestframework")
    }


# --- CPU of a process tree -----------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime + cutime + cstime of ``pid`` and its live descendants (an exited,
    reaped child's time is in its parent's cutime/cstime, so nothing counts twice)."""
    total = 0.0
    stack = [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while stack:
        current = stack.pop()
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / tick
            stack += _children(current)
    return total


@dataclass
class Peer:
    """One server under load: where it is, how to measure it, what it is asked."""

    name: str
    base: str
    pid: int
    headers: dict[str, str]
    idle_cpu_per_s: float = 0.0

    def cpu(self) -> float:
        return tree_cpu_seconds(self.pid)

    def client_args(self, warm_path: str) -> dict[str, Any]:
        return {"base": self.base, "headers": self.headers, "warm_path": warm_path}

    def measure_idle(self, seconds: float) -> None:
        c0, t0 = self.cpu(), time.monotonic()
        time.sleep(seconds)
        self.idle_cpu_per_s = (self.cpu() - c0) / (time.monotonic() - t0)


# --- Prefect's server ----------------------------------------------------------------------------


def prefect_env(db_url: str, home: str, services: str) -> dict[str, str]:
    env = {
        **os.environ,
        **SETTINGS_BASE,
        "PREFECT_HOME": home,
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": db_url,
        "PREFECT_API_DATABASE_CONNECTION_URL": db_url,
    }
    # Nothing of the project's environment should leak into Prefect's settings.
    for key in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV"):
        env.pop(key, None)
    if services == "events":
        for name in SERVICES_OFF:
            env[f"PREFECT_SERVER_SERVICES_{name}_ENABLED"] = "false"
        env["PREFECT_SERVER_EVENTS_STREAM_OUT_ENABLED"] = "false"
        env["PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED"] = "false"
    return env


@contextlib.contextmanager
def prefect_server(python: str, db_url: str, services: str) -> Iterator[tuple[str, int]]:
    """``prefect server start`` in the foreground on a free port; yields (base URL, pid)."""
    home = tempfile.mkdtemp(prefix="bench-prefect-home-")
    log = Path(home) / "server.log"
    port = free_port()
    command = [
        str(Path(python).parent / "prefect"),
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "WARNING",
        "--no-ui",
        "--analytics-off",
    ]
    if services != "default":
        command += ["--no-scheduler", "--no-late-runs"]
    if services == "none":
        command.append("--no-services")
    out = open(log, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        command,
        cwd=home,
        env=prefect_env(db_url, home, services),
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            # The first start migrates an empty database: allow it time.
            wait_for_http(base + "/api/health", timeout=180)
        except RuntimeError:
            out.flush()
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"Prefect's server did not start; its log ends:\n{tail}") from None
        if proc.poll() is not None:
            raise RuntimeError(f"Prefect's server exited ({proc.returncode}); see {log}")
        yield base, proc.pid
    finally:
        stop_process(proc, timeout=15)
        out.close()
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def empty_database(name: str, *, keep: bool) -> Iterator[str]:
    """A fresh empty database on the benchmark's server (Prefect migrates it itself)."""
    base = base_database_url()
    with _admin_connect(base) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(base, name)
    finally:
        if keep:
            print(f"(kept database {name})")
        else:
            with _admin_connect(base) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def asyncpg_url(url: str) -> str:
    """postgres://user@host:port/db -> postgresql+asyncpg://user@host:port/db"""
    return "postgresql+asyncpg://" + url.split("://", 1)[1]


def prefect_flow_runs(base: str, count: int, state: str) -> list[str]:
    """Flow runs of one deployment-free flow, created over Prefect's API in ``state``."""
    import httpx

    with httpx.Client(base_url=base, timeout=60) as client:
        response = client.post("/api/flows/", json={"name": "bench-flow"})
        response.raise_for_status()
        flow_id = response.json()["id"]

    def create(chunk: range) -> list[str]:
        ids = []
        with httpx.Client(base_url=base, timeout=60) as client:
            for i in chunk:
                response = client.post(
                    "/api/flow_runs/",
                    json={
                        "flow_id": flow_id,
                        "name": f"bench-{i}",
                        "parameters": {"i": i},
                        "state": {"type": state, "name": state.title()},
                    },
                )
                response.raise_for_status()
                assert response.json()["state_type"] == state, response.text
                ids.append(response.json()["id"])
        return ids

    with ThreadPoolExecutor(4) as pool:
        chunks = [range(k, count, 4) for k in range(4)]
        return [i for ids in pool.map(create, chunks) for i in ids]


def prefect_states(db_url: str) -> dict[str, Any]:
    """What the cancels left in Prefect's database: flow runs by state, events by kind."""
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        runs = dict(conn.execute("SELECT state_type, count(*) FROM flow_run GROUP BY 1").fetchall())
        events = dict(conn.execute("SELECT event, count(*) FROM events GROUP BY 1").fetchall())
        states = conn.execute("SELECT count(*) FROM flow_run_state").fetchone()[0]
    return {"flow_runs_by_state": runs, "events": events, "flow_run_state_rows": states}


# --- The one client ------------------------------------------------------------------------------


def http_client(
    items: Sequence[Any], args: dict[str, Any], record: Record, ready: Callable[[], None]
) -> None:
    """Both servers' client: one keep-alive connection; items are (method, path, body, key)."""
    import httpx

    with httpx.Client(base_url=args["base"], headers=args["headers"], timeout=60) as client:
        client.get(args["warm_path"])  # open the keep-alive connection before the clock starts
        ready()
        for method, path, body, key in items:
            headers = {"Idempotency-Key": key} if key else None
            t0 = time.perf_counter()
            response = client.request(method, path, json=body, headers=headers)
            elapsed = time.perf_counter() - t0
            record(elapsed, str(response.status_code))


def merged(results: Sequence[LoadResult]) -> LoadResult:
    outcomes: dict[str, int] = {}
    for result in results:
        for key, count in result.outcomes.items():
            outcomes[key] = outcomes.get(key, 0) + count
    return LoadResult(
        operations=sum(r.operations for r in results),
        wall_seconds=sum(r.wall_seconds for r in results),
        latencies_ms=[lat for r in results for lat in r.latencies_ms],
        outcomes=outcomes,
        client_cpu_seconds=sum(r.client_cpu_seconds for r in results),
    )


def measure_pair(
    peers: Sequence[Peer],
    items: dict[str, list[Any]],
    clients: int,
    warm: dict[str, str],
    settle: float,
) -> dict[str, tuple[LoadResult, float]]:
    """Drive the two servers in halves, A B B A, so that a change in the machine's load
    falls on both; return each server's (result, CPU ms per operation).

    Each server's CPU is its own process tree's, read before the first half and after the
    trailing ``settle`` seconds, less its idle rate over that window."""
    a, b = peers
    halves = {p.name: [items[p.name][0::2], items[p.name][1::2]] for p in peers}
    results: dict[str, list[LoadResult]] = {p.name: [] for p in peers}
    c0 = {p.name: p.cpu() for p in peers}
    t0 = time.monotonic()
    for peer, half in ((a, 0), (b, 0), (b, 1), (a, 1)):
        chunk = halves[peer.name][half]
        results[peer.name].append(
            run_load(http_client, split(chunk, clients), peer.client_args(warm[peer.name]))
        )
    time.sleep(settle)  # work a server defers (Prefect's event persister) counts too
    t1 = time.monotonic()
    out = {}
    for peer in peers:
        cpu = max(0.0, (peer.cpu() - c0[peer.name]) - peer.idle_cpu_per_s * (t1 - t0))
        out[peer.name] = (merged(results[peer.name]), cpu / len(items[peer.name]) * 1000)
    return out


def _queued_runs(agent: str, count: int) -> list[str]:
    from runs import services

    return [services.run_start(agent=agent, input={"i": i}).id for i in range(count)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4", help="client counts (default 1,4)")
    parser.add_argument(
        "--requests", type=int, default=200, help="operations per client per operation"
    )
    parser.add_argument(
        "--prefect-from",
        choices=("scheduled", "running"),
        default="scheduled",
        help="state of the flow runs Prefect cancels (default scheduled: they end CANCELLED)",
    )
    parser.add_argument(
        "--prefect-services",
        choices=("events", "default", "none"),
        default="events",
        help="Prefect's background services: the event persister only (default), "
        "Prefect's defaults, or none (--no-services)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=6.0,
        help="seconds of server CPU counted after each load (default 6)",
    )
    add_server_arguments(parser, workers_help="Holdpoint's server processes")
    parser.add_argument("--keep", action="store_true", help="keep both scratch databases")
    opts = parser.parse_args(argv)
    client_counts = parse_int_list(opts.clients)
    per = opts.requests
    total = sum(client_counts) * per

    python = prefect_python()
    versions = {"prefect": prefect_versions(python), "holdpoint": holdpoint_versions()}
    print(
        f"Prefect {versions['prefect']['prefect']} (SQLAlchemy {versions['prefect']['sqlalchemy']},"
        f" asyncpg {versions['prefect']['asyncpg']}, uvicorn {versions['prefect']['uvicorn']});"
        f" Holdpoint on Django {versions['holdpoint']['django']},"
        f" uvicorn {versions['holdpoint']['uvicorn']}, daphne {versions['holdpoint']['daphne']}",
        flush=True,
    )
    peer_db = f"{database_name(base_database_url())}_prefect_peer"
    prefect_state = opts.prefect_from.upper()

    with (
        scratch_database("prefect", keep=opts.keep),
        empty_database(peer_db, keep=opts.keep) as peer_url,
    ):
        setup_django()
        agent = declare_bench_agent()
        _user, token = person("bench-operator", "operator")
        print(f"preparing {total} queued Holdpoint runs ...", flush=True)
        t0 = time.monotonic()
        warm_run, *queued = _queued_runs(agent, total + 1)
        print(f"  prepared in {time.monotonic() - t0:.1f} s", flush=True)

        with (
            web_server(opts.server, workers=opts.workers) as hp_server,
            prefect_server(python, asyncpg_url(peer_url), opts.prefect_services) as (
                pf_base,
                pf_pid,
            ),
        ):
            print(f"preparing {total} {prefect_state} Prefect flow runs ...", flush=True)
            t0 = time.monotonic()
            pf_warm, *flow_runs = prefect_flow_runs(pf_base, total + 1, prefect_state)
            print(f"  prepared in {time.monotonic() - t0:.1f} s", flush=True)
            holdpoint = Peer(
                "Holdpoint", hp_server.base, hp_server.pid, {"Authorization": f"Token {token}"}
            )
            prefect = Peer("Prefect", pf_base, pf_pid, {})
            # The same path for each server in its client: open the connection, warm the route.
            warm = {holdpoint.name: "/healthz", prefect.name: "/api/health"}
            cancel_body = {
                "state": {"type": "CANCELLING", "name": "Cancelling"},
                "force": False,
            }
            # Warm both: imports, routes, first database connections, the ORM's caches.
            run_load(
                http_client,
                [
                    [("POST", f"/api/runs/{warm_run}/cancel", {"reason": "warm"}, "warm")] * 20
                    + [("GET", f"/api/runs/{warm_run}", None, None)] * 20
                ],
                holdpoint.client_args(warm[holdpoint.name]),
            )
            run_load(
                http_client,
                [
                    [("POST", f"/api/flow_runs/{pf_warm}/set_state", cancel_body, None)] * 20
                    + [("GET", f"/api/flow_runs/{pf_warm}", None, None)] * 20
                ],
                prefect.client_args(warm[prefect.name]),
            )
            # Let Prefect's persister write the preparation's events, then learn each
            # server's idle CPU over as long as one trailing window.
            time.sleep(opts.settle)
            for peer in (holdpoint, prefect):
                peer.measure_idle(max(opts.settle, 3.0))
            print(
                "idle CPU: "
                + ", ".join(
                    f"{p.name} {p.idle_cpu_per_s * 1000:.1f} ms/s" for p in (holdpoint, prefect)
                ),
                flush=True,
            )

            figures: dict[str, Any] = {
                "versions": versions,
                "prefect_from": opts.prefect_from,
                "prefect_services": opts.prefect_services,
                "settle_seconds": opts.settle,
                "idle_cpu_ms_per_s": {
                    p.name: round(p.idle_cpu_per_s * 1000, 2) for p in (holdpoint, prefect)
                },
                "clients": {},
            }
            rows: list[list[Any]] = []
            ratio_rows: list[list[Any]] = []
            checks: list[bool] = []
            for clients in client_counts:
                n = clients * per
                hp_ids, queued = queued[:n], queued[n:]
                pf_ids, flow_runs = flow_runs[:n], flow_runs[n:]
                ops: dict[str, dict[str, list[Any]]] = {
                    "cancel": {
                        holdpoint.name: [
                            (
                                "POST",
                                f"/api/runs/{r}/cancel",
                                {"reason": "bench"},
                                f"c-{uuid.uuid4()}",
                            )
                            for r in hp_ids
                        ],
                        prefect.name: [
                            ("POST", f"/api/flow_runs/{r}/set_state", cancel_body, None)
                            for r in pf_ids
                        ],
                    },
                    "read": {
                        holdpoint.name: [("GET", f"/api/runs/{r}", None, None) for r in hp_ids],
                        prefect.name: [("GET", f"/api/flow_runs/{r}", None, None) for r in pf_ids],
                    },
                }
                entry: dict[str, Any] = {}
                for op, per_server in ops.items():
                    measured = measure_pair(
                        (holdpoint, prefect), per_server, clients, warm, opts.settle
                    )
                    entry[op] = {}
                    for name, (result, cpu_ms) in measured.items():
                        s = result.summary
                        answers = ", ".join(f"{k}x{v}" for k, v in sorted(result.outcomes.items()))
                        rows.append(
                            [
                                op,
                                name,
                                clients,
                                result.throughput,
                                s.p50,
                                s.p95,
                                s.p99,
                                cpu_ms,
                                answers,
                            ]
                        )
                        entry[op][name] = {
                            **result.as_dict(),
                            "server_cpu_ms_per_op": round(cpu_ms, 3),
                        }
                    (hp, hp_cpu), (pf, pf_cpu) = measured[holdpoint.name], measured[prefect.name]
                    tp_ratio = hp.throughput / pf.throughput if pf.throughput else float("nan")
                    cpu_ratio = hp_cpu / pf_cpu if pf_cpu else float("nan")
                    tp_ok, cpu_ok = tp_ratio >= 2.0, cpu_ratio <= 0.5
                    checks += [tp_ok, cpu_ok]
                    ratio_rows.append(
                        [
                            op,
                            clients,
                            f"{tp_ratio:.3f}x",
                            verdict(tp_ok),
                            f"{cpu_ratio:.3f}x",
                            verdict(cpu_ok),
                        ]
                    )
                    entry[op]["throughput_ratio"] = round(tp_ratio, 3)
                    entry[op]["cpu_ratio"] = round(cpu_ratio, 3)
                    entry[op]["verdicts"] = {"throughput": verdict(tp_ok), "cpu": verdict(cpu_ok)}
                    print(
                        f"  {op}, {clients} client(s): Holdpoint {hp.throughput:.0f}/s "
                        f"{hp_cpu:.2f} ms CPU/op; Prefect {pf.throughput:.0f}/s {pf_cpu:.2f} ms CPU/op",
                        flush=True,
                    )
                figures["clients"][str(clients)] = entry

            time.sleep(1)
            figures["prefect_database_after"] = prefect_states(peer_url)

        from django.db.models import Count

        from runs.models import Run

        figures["holdpoint_runs_by_status"] = {
            row["status"]: row["n"] for row in Run.objects.values("status").annotate(n=Count("id"))
        }

    print()
    print(
        f"Holdpoint ({opts.server} x{opts.workers}, DATABASE_POOL_SIZE=8, token auth, "
        "Idempotency-Key) vs Prefect "
        f"{versions['prefect']['prefect']} (prefect server start, services: {opts.prefect_services}; "
        f"cancel from {prefect_state}); server CPU counted over the load + {opts.settle:g} s, less idle"
    )
    print(
        table(
            [
                "operation",
                "server",
                "clients",
                "ops/s",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "server CPU ms/op",
                "answers",
            ],
            rows,
        )
    )
    print()
    print("Holdpoint / Prefect (targets: throughput >= 2x, CPU per op <= 0.5x)")
    print(
        table(
            ["operation", "clients", "throughput", "verdict", "CPU/op", "verdict"],
            ratio_rows,
        )
    )
    print(
        "idle CPU subtracted: "
        + ", ".join(f"{k} {v} ms/s" for k, v in figures["idle_cpu_ms_per_s"].items())
    )
    after = figures["prefect_database_after"]
    print(
        "Prefect's database afterwards: flow runs "
        + json.dumps(after["flow_runs_by_state"], sort_keys=True)
        + f", {after['flow_run_state_rows']} state rows, events "
        + json.dumps(after["events"], sort_keys=True)
    )
    print(
        "Holdpoint's runs afterwards: "
        + json.dumps(figures["holdpoint_runs_by_status"], sort_keys=True)
    )
    figures["all_targets_met"] = all(checks)
    figures["targets"] = [
        f"{operation}, {clients} client(s): {side['throughput_ratio']}x Prefect's throughput "
        f"({side['verdicts']['throughput']} >= 2x), {side['cpu_ratio']}x its server CPU per "
        f"operation ({side['verdicts']['cpu']} <= 0.5x)"
        for clients, by_operation in figures["clients"].items()
        for operation, side in by_operation.items()
    ]
    save_result("prefect_peer", figures)
    return figures


if __name__ == "__main__":
    main()
