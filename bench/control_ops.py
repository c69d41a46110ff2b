"""Control operations over real HTTP: cancel, retry and resume at 1 and 4 concurrent clients.

The web server as the Procfile runs it (uvicorn, a worker process per core; --server and
--workers choose another) serves the control API on this script's own database, configured
as the Procfile's ``web`` line runs it (a psycopg pool of 8 connections; ``--pool 0``
opens a connection per request instead); clients
authenticate with a DRF token and send a fresh ``Idempotency-Key`` per operation
(and, in the "cancel, replayed" row, the same keys again: the stored answer comes back).
Each run is acted on once, so every request does the full work: cancel a queued run,
retry the cancelled run, answer a run waiting at a hold point.

Baseline in the same run: raw psycopg ``UPDATE one row; COMMIT`` at the same number
of client processes on the same database. Target (issue 17): throughput >= 10 % of the baseline,
p99 <= 50 ms at 4 clients.

    python -m bench.control_ops [--clients 1,4] [--requests 200] [--pool 8] [--keep]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from bench.common import (
    Summary,
    add_server_arguments,
    declare_bench_agent,
    parse_int_list,
    person,
    save_result,
    scratch_database,
    setup_django,
    table,
    verdict,
    web_server,
)
from bench.load import LoadResult, Record, baseline, run_load, split

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"version": {"type": "string"}},
    "required": ["version"],
}


def http_client(
    items: Sequence[Any], args: dict[str, Any], record: Record, ready: Callable[[], None]
) -> None:
    import httpx

    headers = {"Authorization": f"Token {args['token']}"}
    with httpx.Client(base_url=args["base"], headers=headers, timeout=60) as client:
        client.get("/healthz")  # open the keep-alive connection before the clock starts
        ready()
        for path, body, key in items:
            t0 = time.perf_counter()
            response = client.post(path, json=body, headers={"Idempotency-Key": key})
            elapsed = time.perf_counter() - t0
            replayed = response.headers.get("Idempotent-Replayed") == "true"
            record(elapsed, f"{response.status_code}{' replayed' if replayed else ''}")


def _queued_runs(agent: str, count: int) -> list[str]:
    from runs import services

    return [services.run_start(agent=agent, input={"i": i}).id for i in range(count)]


def waiting_runs(agent: str, count: int) -> list[tuple[str, str, str]]:
    """Runs stopped at a hold point: (run_id, request_id, checkpoint_id)."""
    from runs import services

    out = []
    for i in range(count):
        run = services.run_start(agent=agent, input={"i": i})
        lease = services.attempt_claim(worker_id="bench-prep")
        assert lease is not None and lease.run_id == run.id
        epochs = {
            "attempt_id": lease.attempt_id,
            "lease_epoch": lease.lease_epoch,
            "cancel_epoch": lease.cancel_epoch,
        }
        checkpoint = services.checkpoint_save(**epochs, step="ask", state={"i": i})
        request = services.attempt_interrupt(
            **epochs,
            checkpoint_id=checkpoint.id,
            kind="input_required",
            prompt="Which version?",
            accepted_schema=ANSWER_SCHEMA,
        )
        out.append((run.id, request.id, checkpoint.id))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4", help="client counts (default 1,4)")
    parser.add_argument(
        "--requests", type=int, default=200, help="operations per client per operation"
    )
    parser.add_argument(
        "--pool",
        type=int,
        default=8,
        help="DATABASE_POOL_SIZE of each server process (default 8, as the Procfile; 0: none)",
    )
    add_server_arguments(parser)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    opts = parser.parse_args(argv)
    client_counts = parse_int_list(opts.clients)
    per = opts.requests

    with scratch_database("control", keep=opts.keep) as url:
        setup_django()
        agent = declare_bench_agent()
        _user, token = person("bench-operator", "operator")
        total = sum(client_counts) * per
        print(f"preparing {total} runs at a hold point and {total} queued runs ...", flush=True)
        t0 = time.monotonic()
        waiting = waiting_runs(agent, total)
        warm_run, *queued = _queued_runs(agent, total + 1)
        print(f"  prepared in {time.monotonic() - t0:.1f} s", flush=True)

        rows: list[list[Any]] = []
        figures: dict[str, Any] = {"clients": {}, "database_pool_size": opts.pool}
        with web_server(
            opts.server, workers=opts.workers, env={"DATABASE_POOL_SIZE": str(opts.pool)}
        ) as server:
            args = {"base": server.base, "token": token}
            # Warm the server: imports, URL resolver, first connections.
            run_load(
                http_client,
                [[(f"/api/runs/{warm_run}/cancel", {"reason": "warm"}, "warm-up")] * 20],
                args,
            )
            for clients in client_counts:
                n = clients * per
                cancel_ids, queued = queued[:n], queued[n:]
                resume_set, waiting = waiting[:n], waiting[n:]
                ops: dict[str, list[tuple[str, dict[str, Any], str]]] = {
                    "cancel": [
                        (f"/api/runs/{r}/cancel", {"reason": "bench"}, f"c-{uuid.uuid4()}")
                        for r in cancel_ids
                    ],
                }
                ops["retry"] = [
                    (f"/api/runs/{r}/retry", {"reason": "bench"}, f"r-{uuid.uuid4()}")
                    for r in cancel_ids
                ]
                ops["resume"] = [
                    (
                        f"/api/runs/{r}/resume",
                        {"request_id": q, "checkpoint_id": c, "value": {"version": "v2"}},
                        f"a-{uuid.uuid4()}",
                    )
                    for r, q, c in resume_set
                ]
                ops["cancel, replayed"] = ops["cancel"]
                results: dict[str, LoadResult] = {}
                base_before = baseline(url, clients, per)
                server_cpu: dict[str, float] = {}
                for name, items in ops.items():
                    cpu0 = server.cpu_seconds()
                    results[name] = run_load(http_client, split(items, clients), args)
                    server_cpu[name] = (server.cpu_seconds() - cpu0) / len(items) * 1000
                base_after = baseline(url, clients, per)
                base_tp = (base_before.throughput + base_after.throughput) / 2
                base_lat = sorted(base_before.latencies_ms + base_after.latencies_ms)

                base_summary = Summary.of(base_lat)
                rows.append(
                    [
                        clients,
                        "baseline UPDATE+COMMIT",
                        base_tp,
                        base_summary.p50,
                        base_summary.p95,
                        base_summary.p99,
                        "1.00",
                        "",
                        "",
                    ]
                )
                entry: dict[str, Any] = {
                    "baseline": {
                        "before": base_before.as_dict(),
                        "after": base_after.as_dict(),
                        "throughput_per_s": round(base_tp, 1),
                        "latency_ms": base_summary.as_dict(),
                    }
                }
                for name, result in results.items():
                    s = result.summary
                    ratio = result.throughput / base_tp if base_tp else float("nan")
                    outcomes = ", ".join(f"{k}x{v}" for k, v in sorted(result.outcomes.items()))
                    rows.append(
                        [
                            clients,
                            name,
                            result.throughput,
                            s.p50,
                            s.p95,
                            s.p99,
                            f"{ratio:.1%}",
                            server_cpu[name],
                            outcomes,
                        ]
                    )
                    entry[name] = {
                        **result.as_dict(),
                        "ratio_to_baseline": round(ratio, 4),
                        "server_cpu_ms_per_op": round(server_cpu[name], 2),
                    }
                figures["clients"][str(clients)] = entry
                print(
                    f"  {clients} client(s): "
                    + ", ".join(f"{k} {v.throughput:.0f}/s" for k, v in results.items())
                    + f"; baseline {base_tp:.0f}/s",
                    flush=True,
                )

    print()
    print(
        f"Control operations over HTTP ({opts.server} x{opts.workers}, token auth, Idempotency-Key, "
        f"DATABASE_POOL_SIZE={opts.pool}) vs raw UPDATE+COMMIT"
    )
    print(
        table(
            [
                "clients",
                "operation",
                "ops/s",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "vs baseline",
                "server CPU ms/op",
                "answers",
            ],
            rows,
        )
    )
    top = str(max(client_counts))
    if top == "4":
        checks = []
        for name in ("cancel", "retry", "resume"):
            entry = figures["clients"][top][name]
            checks.append(
                f"{name}: {entry['ratio_to_baseline']:.1%} of baseline "
                f"({verdict(entry['ratio_to_baseline'] >= 0.10)} >= 10 %), "
                f"p99 {entry['latency_ms']['p99']:.1f} ms "
                f"({verdict(entry['latency_ms']['p99'] <= 50)} <= 50 ms)"
            )
        figures["targets"] = checks
        print("Targets at 4 clients:")
        for line in checks:
            print("  " + line)
    save_result("control_ops", figures)
    return figures


if __name__ == "__main__":
    main()
