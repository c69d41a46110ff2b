"""What one API request costs the web process: CPU and SQL statements, in-process.

No server and no sockets: each request goes through Django's whole handler and
middleware chain (``django.core.handlers.wsgi.WSGIHandler``, the settings as the
Procfile runs them, ``DATABASE_POOL_SIZE=8``), so what is measured is the application
alone. CPU is ``time.process_time()`` of this process across N requests; statements are
counted with ``connection.execute_wrapper``, plus BEGIN and COMMIT (or ROLLBACK) for
each transaction (psycopg sends them as statements of their own); "transactions" counts
commits that write (an autocommitted write is one of its own; a lone SELECT is not).
Timing on a shared machine is noisy, CPU per request much less so; the statement count
is exact.

Baselines in the same run: a raw psycopg ``UPDATE one row; COMMIT`` loop in this
process (the client-side CPU of the floor the database sets), and
``GET /api/no-such-route`` (the handler, the middleware and the URL resolver, no view).

Targets (issue 17): cancel, resume, retry, POST /api/runs <= 3 ms; GET /api/runs/{id}
<= 1.5 ms; a 404 <= 0.8 ms; worker heartbeat and checkpoint <= 2 ms; <= 8 statements
per control operation.

    python -m bench.request_cost [--requests 300] [--profile OP] [--show-sql OP] [--keep]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from bench.common import (
    declare_bench_agent,
    person,
    save_result,
    scratch_database,
    setup_django,
    table,
    verdict,
)
from bench.control_ops import waiting_runs

# operation -> (target CPU ms, target statements or None)
TARGETS: dict[str, tuple[float, int | None]] = {
    "cancel": (3.0, 8),
    "resume": (3.0, 8),
    "retry": (3.0, 8),
    "POST /api/runs": (3.0, 8),
    "GET /api/runs/{id}": (1.5, None),
    "404": (0.8, None),
    "heartbeat": (2.0, None),
    "checkpoint": (2.0, None),
}


class Caller:
    """Calls the WSGI handler with a ready environ: no client library in the measurement."""

    def __init__(self) -> None:
        from django.core.handlers.wsgi import WSGIHandler

        self.handler = WSGIHandler()
        self.status = ""

    def _start(self, status: str, headers: Any, exc_info: Any = None) -> None:
        self.status = status

    def __call__(
        self, method: str, path: str, *, auth: str, body: Any = None, key: str = ""
    ) -> str:
        raw = b"" if body is None else json.dumps(body).encode()
        environ = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "SCRIPT_NAME": "",
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "HTTP_HOST": "127.0.0.1:8000",
            "REMOTE_ADDR": "127.0.0.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "HTTP_AUTHORIZATION": auth,
            "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(raw)),
            "wsgi.input": io.BytesIO(raw),
            "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            "wsgi.version": (1, 0),
        }
        if key:
            environ["HTTP_IDEMPOTENCY_KEY"] = key
        response = self.handler(environ, self._start)
        for _chunk in response:
            pass
        response.close()
        return self.status.split(" ", 1)[0]


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self.commits = 0
        self.sql: list[str] = []
        self.keep = False

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.n += 1
        writes = sql.lstrip()[:6].upper() != "SELECT"
        if writes and not context["connection"].in_atomic_block:
            self.commits += 1  # an autocommitted write: a commit of its own (no BEGIN sent)
        if self.keep:
            self.sql.append(sql)
        return execute(sql, params, many, context)

    def count_transaction_ends(self, connection: Any) -> None:
        """psycopg sends BEGIN and COMMIT (or ROLLBACK) as statements of their own, which
        ``execute_wrapper`` does not see: count them at each end of a transaction."""
        commit, rollback = connection._commit, connection._rollback

        def counted_commit() -> None:
            self.n += 2
            self.commits += 1
            commit()

        def counted_rollback() -> None:
            self.n += 2
            rollback()

        connection._commit = counted_commit
        connection._rollback = counted_rollback


def _raw_update_cpu(url: str, n: int) -> float:
    """Client CPU ms of one ``UPDATE one row; COMMIT`` through psycopg (the floor)."""
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_cost_row (id int PRIMARY KEY, n int)")
        conn.execute("INSERT INTO bench_cost_row VALUES (1, 0) ON CONFLICT DO NOTHING")
        conn.commit()
        for _ in range(20):
            conn.execute("UPDATE bench_cost_row SET n = n + 1 WHERE id = 1")
            conn.commit()
        c0 = time.process_time()
        for _ in range(n):
            conn.execute("UPDATE bench_cost_row SET n = n + 1 WHERE id = 1")
            conn.commit()
        return (time.process_time() - c0) / n * 1000


def _prepare(n: int, worker_token_id: int) -> dict[str, Iterator[Any]]:
    """Runs for every operation: queued (cancel), cancelled (retry), at a hold point (resume),
    running under a worker token (heartbeat, checkpoint)."""
    from runs import services

    agent = declare_bench_agent()
    waiting = waiting_runs(agent, n)
    # One running attempt per worker call kind, beaten and checkpointed many times.
    run = services.run_start(agent=agent, input={"live": True})
    lease = services.attempt_claim(
        worker_id="bench-live", lease_seconds=3600, worker_token_id=worker_token_id
    )
    assert lease is not None and lease.run_id == run.id
    queued = [services.run_start(agent=agent, input={"i": i}).id for i in range(2 * n)]
    cancelled = []
    for run_id in queued[n:]:
        services.run_cancel(run_id=run_id, reason="prep")
        cancelled.append(run_id)
    return {
        "cancel": iter(queued[:n]),
        "retry": iter(cancelled),
        "resume": iter(waiting),
        "lease": iter([lease] * (10 * n)),
        "get": iter([run.id] * (10 * n)),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="measured requests per op")
    parser.add_argument("--warm", type=int, default=30, help="unmeasured requests first")
    parser.add_argument("--profile", default="", help="cProfile one operation, print top 40")
    parser.add_argument("--show-sql", default="", help="print the SQL of one request of OP")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    opts = parser.parse_args(argv)
    n, warm = opts.requests, opts.warm

    os.environ.setdefault("DATABASE_POOL_SIZE", "8")
    with scratch_database("cost", keep=opts.keep) as url:
        setup_django()
        import logging

        from django.db import connection

        # The 404 rows would print a "Not Found" warning per request: not the figures.
        logging.getLogger("django.request").setLevel(logging.ERROR)

        from runs.tokens import worker_token_create

        _user, token = person("bench-operator", "operator")
        # POST /api/runs needs the start permission; the operator group holds it.
        wtoken, secret = worker_token_create(name="bench-worker")
        total = n + warm
        print(f"preparing runs for {total} requests per operation ...", flush=True)
        t0 = time.monotonic()
        prepared = _prepare(total, wtoken.pk)
        print(f"  prepared in {time.monotonic() - t0:.1f} s", flush=True)
        people = f"Token {token}"
        worker = f"Bearer {secret}"
        call = Caller()
        agent = declare_bench_agent()

        def cancel() -> str:
            run_id = next(prepared["cancel"])
            return call(
                "POST",
                f"/api/runs/{run_id}/cancel",
                auth=people,
                body={"reason": "bench"},
                key=f"c-{uuid.uuid4()}",
            )

        def retry() -> str:
            run_id = next(prepared["retry"])
            return call(
                "POST",
                f"/api/runs/{run_id}/retry",
                auth=people,
                body={"reason": "bench"},
                key=f"r-{uuid.uuid4()}",
            )

        def resume() -> str:
            run_id, request_id, checkpoint_id = next(prepared["resume"])
            body = {
                "request_id": request_id,
                "checkpoint_id": checkpoint_id,
                "value": {"version": "v2"},
            }
            return call(
                "POST",
                f"/api/runs/{run_id}/resume",
                auth=people,
                body=body,
                key=f"a-{uuid.uuid4()}",
            )

        def start() -> str:
            return call(
                "POST",
                "/api/runs",
                auth=people,
                body={"agent": agent, "input": {"x": 1}},
                key=f"s-{uuid.uuid4()}",
            )

        live_run = next(prepared["get"])

        def get_run() -> str:
            return call("GET", f"/api/runs/{live_run}", auth=people)

        def missing() -> str:
            return call("GET", "/api/runs/run_00000000000000000000000000", auth=people)

        def heartbeat() -> str:
            lease = next(prepared["lease"])
            return call(
                "POST",
                f"/api/worker/attempts/{lease.attempt_id}/heartbeat",
                auth=worker,
                body={"lease_epoch": lease.lease_epoch, "lease_seconds": 3600},
                key=f"h-{uuid.uuid4()}",  # as holdpoint_client and the TypeScript client send
            )

        step = iter(range(10**9))

        def checkpoint() -> str:
            lease = next(prepared["lease"])
            return call(
                "POST",
                f"/api/worker/attempts/{lease.attempt_id}/checkpoint",
                auth=worker,
                body={
                    "lease_epoch": lease.lease_epoch,
                    "cancel_epoch": lease.cancel_epoch,
                    "step": f"s{next(step)}",
                    "state": {"k": "v"},
                },
                key=f"k-{uuid.uuid4()}",
            )

        def no_route() -> str:
            return call("GET", "/api/no-such-route", auth="")

        ops: dict[str, tuple[Callable[[], str], str]] = {
            "GET /api/no-such-route (floor)": (no_route, "404"),
            "cancel": (cancel, "202"),
            "resume": (resume, "202"),
            "retry": (retry, "202"),
            "POST /api/runs": (start, "201"),
            "GET /api/runs/{id}": (get_run, "200"),
            "404": (missing, "404"),
            "heartbeat": (heartbeat, "200"),
            "checkpoint": (checkpoint, "201"),
        }
        counter = Counter()
        counter.count_transaction_ends(connection)
        raw_cpu = _raw_update_cpu(url, n)
        figures: dict[str, Any] = {"raw_update_commit_cpu_ms": round(raw_cpu, 3), "ops": {}}
        rows: list[list[Any]] = [["raw UPDATE;COMMIT (psycopg)", raw_cpu, 2, 1, "", "", "", ""]]
        with connection.execute_wrapper(counter):
            for name, (fn, expect) in ops.items():
                for _ in range(warm):
                    status = fn()
                    if status != expect:
                        raise SystemExit(f"{name}: answered {status}, expected {expect}")
                if opts.show_sql == name:
                    counter.keep, counter.sql = True, []
                    fn()
                    counter.keep = False
                    print(f"\nSQL of one {name}:")
                    for sql in counter.sql:
                        print("  ", sql[:300])
                if opts.profile == name:
                    import cProfile
                    import pstats

                    prof = cProfile.Profile(time.process_time)  # CPU, not waits
                    prof.enable()
                    for _ in range(n):
                        fn()
                    prof.disable()
                    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
                    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
                    continue
                counter.n = counter.commits = 0
                c0 = time.process_time()
                for _ in range(n):
                    fn()
                cpu = (time.process_time() - c0) / n * 1000
                statements = counter.n / n
                commits = counter.commits / n
                target = TARGETS.get(name)
                cpu_ok = None if target is None else cpu <= target[0]
                st_ok = None if target is None or target[1] is None else statements <= target[1]
                rows.append(
                    [
                        name,
                        cpu,
                        statements,
                        commits,
                        f"<= {target[0]} ms" if target else "",
                        verdict(cpu_ok) if target else "",
                        f"<= {target[1]}" if target and target[1] else "",
                        verdict(st_ok) if target and target[1] else "",
                    ]
                )
                figures["ops"][name] = {
                    "cpu_ms": round(cpu, 3),
                    "statements": round(statements, 2),
                    "transactions": round(commits, 2),
                    "cpu_target_ms": target[0] if target else None,
                    "statement_target": target[1] if target else None,
                    "cpu_met": cpu_ok,
                    "statements_met": st_ok,
                    "x_raw_update": round(cpu / raw_cpu, 1) if raw_cpu else None,
                }

    print()
    print(
        f"CPU and SQL statements per request, in-process (Django handler + whole middleware "
        f"chain, {n} requests each, after {warm} unmeasured)"
    )
    print(
        table(
            [
                "request",
                "CPU ms",
                "statements",
                "transactions",
                "CPU target",
                "CPU",
                "stmt target",
                "stmts",
            ],
            rows,
        )
    )
    figures["targets"] = [
        f"{name}: CPU {op['cpu_ms']} ms per request ({verdict(op['cpu_met'])} "
        f"<= {op['cpu_target_ms']} ms)"
        + (
            f", {op['statements']:g} statements ({verdict(op['statements_met'])} "
            f"<= {op['statement_target']})"
            if op["statement_target"]
            else ""
        )
        + f"; a raw UPDATE; COMMIT: {figures['raw_update_commit_cpu_ms']} ms"
        for name, op in figures["ops"].items()
        if op["cpu_target_ms"] is not None
    ]
    save_result("request_cost", figures)
    return figures


if __name__ == "__main__":
    main()
