"""The same API under each web server: which one should production run?

Servers (``bench.common.SERVERS``): daphne (one process, the Procfile's line until this
measurement), uvicorn (uvloop, httptools) and granian serving ``config.asgi``, and
gunicorn (gthread) and granian serving ``config.wsgi``, each with 1 process and with one
process per core. Every one runs the whole middleware chain and a pool of 8 database
connections per process. Operations: ``POST /api/runs/{id}/cancel`` (a fresh
``Idempotency-Key``, a queued run each) and ``GET /api/runs/{id}``, from 4 client
processes (bench.control_ops's client); throughput, p50/p99 and the server's CPU per
request (its process tree, ``/proc``).

Baseline in the same run: raw psycopg ``UPDATE one row; COMMIT`` at the same client count.

    python -m bench.servers [--servers daphne,uvicorn,...] [--clients 4] [--requests 200]
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from typing import Any

from bench.common import (
    SERVERS,
    declare_bench_agent,
    parse_int_list,
    person,
    save_result,
    scratch_database,
    setup_django,
    table,
    web_server,
)
from bench.control_ops import _queued_runs, http_client
from bench.load import Record, baseline, run_load, split


def get_client(items: Any, args: dict[str, Any], record: Record, ready: Any) -> None:
    import httpx

    headers = {"Authorization": f"Token {args['token']}"}
    with httpx.Client(base_url=args["base"], headers=headers, timeout=60) as client:
        client.get("/healthz")
        ready()
        for path in items:
            t0 = time.perf_counter()
            response = client.get(path)
            record(time.perf_counter() - t0, str(response.status_code))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default=",".join(SERVERS), help="which servers")
    parser.add_argument("--workers", default=f"1,{os.cpu_count() or 1}", help="processes")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=200, help="per client per operation")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    opts = parser.parse_args(argv)
    kinds = opts.servers.split(",")
    worker_counts = sorted(set(parse_int_list(opts.workers)))
    n = opts.clients * opts.requests

    figures: dict[str, Any] = {"clients": opts.clients, "rows": []}
    rows: list[list[Any]] = []
    with scratch_database("servers", keep=opts.keep) as url:
        setup_django()
        agent = declare_bench_agent()
        _user, token = person("bench-operator", "operator")
        configs = [
            (kind, workers)
            for kind in kinds
            for workers in worker_counts
            if not (kind == "daphne" and workers > 1)  # daphne has no workers option
        ]
        print(f"preparing {n * len(configs) + len(configs)} queued runs ...", flush=True)
        queued = _queued_runs(agent, n * len(configs) + len(configs))
        base_before = baseline(url, opts.clients, opts.requests)
        for kind, workers in configs:
            warm, cancel_ids, queued = queued[0], queued[1 : n + 1], queued[n + 1 :]
            with web_server(kind, workers=workers) as server:
                args = {"base": server.base, "token": token}
                run_load(get_client, [[f"/api/runs/{warm}"] * 50] * workers, args)
                ops = {
                    "cancel": (
                        http_client,
                        [
                            (f"/api/runs/{r}/cancel", {"reason": "bench"}, f"s-{uuid.uuid4()}")
                            for r in cancel_ids
                        ],
                    ),
                    "GET run": (get_client, [f"/api/runs/{r}" for r in cancel_ids]),
                }
                for name, (client, items) in ops.items():
                    cpu0 = server.cpu_seconds()
                    result = run_load(client, split(items, opts.clients), args)
                    cpu = (server.cpu_seconds() - cpu0) / len(items) * 1000
                    s = result.summary
                    outcomes = ", ".join(f"{k}x{v}" for k, v in sorted(result.outcomes.items()))
                    rows.append(
                        [kind, workers, name, result.throughput, s.p50, s.p99, cpu, outcomes]
                    )
                    figures["rows"].append(
                        {
                            "server": kind,
                            "workers": workers,
                            "operation": name,
                            **result.as_dict(),
                            "server_cpu_ms_per_op": round(cpu, 2),
                        }
                    )
                    print(
                        f"  {kind} x{workers} {name}: {result.throughput:.0f}/s, "
                        f"p99 {s.p99:.1f} ms, {cpu:.2f} ms CPU",
                        flush=True,
                    )
        base_after = baseline(url, opts.clients, opts.requests)
    base_tp = (base_before.throughput + base_after.throughput) / 2
    figures["baseline_per_s"] = round(base_tp, 1)
    for row in rows:
        row.insert(4, f"{row[3] / base_tp:.1%}")
    print()
    print(
        f"The API under each server, {opts.clients} clients, {opts.requests} requests each; "
        f"baseline UPDATE+COMMIT {base_tp:.0f}/s"
    )
    print(
        table(
            [
                "server",
                "procs",
                "operation",
                "req/s",
                "vs baseline",
                "p50 ms",
                "p99 ms",
                "server CPU ms/req",
                "answers",
            ],
            rows,
        )
    )
    save_result("servers", figures)
    return figures


if __name__ == "__main__":
    main()
