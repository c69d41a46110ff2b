"""What one worker call costs the web process, in-process: CPU and SQL statements.

The worker calls of ``bench.capacity``'s profile (issue 27) through Django's whole handler
and middleware chain (``bench.request_cost.Caller``), with the identity headers a worker
sends, interleaved round by round so that the machine's load falls on all of them alike;
a baseline in the same run: ``GET /api/no-such-route`` (the handler, no view). A batch
heartbeat (``POST /api/worker/heartbeat``) of 1 and of 10 attempts is measured where
the tree has the route, and its cost is also given per attempt renewed. Statements count
BEGIN and COMMIT as ``bench.request_cost`` does.

    python -m bench.worker_call_cost [--requests 300] [--profile OP] [--show-sql OP]
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.common import declare_bench_agent, scratch_database, setup_django, table
from bench.request_cost import Caller, Counter

IDENTITY = {
    "HTTP_HOLDPOINT_WORKER_NAME": "bench-host-1",
    "HTTP_HOLDPOINT_WORKER_CLIENT": "holdpoint-client-python/0.1",
    "HTTP_HOLDPOINT_WORKER_HOST": "bench-host",
    "HTTP_HOLDPOINT_WORKER_PID": "4242",
    "HTTP_HOLDPOINT_WORKER_CONCURRENCY": "10",
    "HTTP_HOLDPOINT_WORKER_AGENTS": "bench-agent",
    "HTTP_HOLDPOINT_WORKER_LEASE_SECONDS": "3600",
}


class IdentifiedCaller(Caller):
    """``Caller`` with the identity headers on every call, as holdpoint_client sends them."""

    def __call__(self, method: str, path: str, **kw: Any) -> str:
        handler = self.handler

        def with_identity(environ: dict[str, Any], start: Any) -> Any:
            environ.update(IDENTITY)
            return handler(environ, start)

        self.handler = with_identity  # type: ignore[assignment]
        try:
            return super().__call__(method, path, **kw)
        finally:
            self.handler = handler


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warm", type=int, default=30)
    parser.add_argument("--profile", default="", help="cProfile one operation, print top 30")
    parser.add_argument("--show-sql", default="", help="print the SQL of one request of OP")
    opts = parser.parse_args(argv)
    os.environ.setdefault("DATABASE_POOL_SIZE", "8")
    with scratch_database("wcost"):
        setup_django()
        import logging

        from django.db import connection
        from django.urls import Resolver404, resolve

        from runs import services
        from runs.tokens import worker_token_create

        logging.getLogger("django.request").setLevel(logging.ERROR)
        wtoken, secret = worker_token_create(name="bench-worker")
        agent = declare_bench_agent()
        leases = []
        for i in range(10):
            services.run_start(agent=agent, input={"i": i})
            lease = services.attempt_claim(
                worker_id=f"bench-host-1/{i}", lease_seconds=3600, worker_token_id=wtoken.pk
            )
            assert lease is not None
            leases.append(lease)
        one = leases[0]
        auth = f"Bearer {secret}"
        call = IdentifiedCaller()
        steps = iter(range(10**9))

        def heartbeat(key: bool) -> Callable[[], str]:
            def go() -> str:
                return call(
                    "POST",
                    f"/api/worker/attempts/{one.attempt_id}/heartbeat",
                    auth=auth,
                    body={"lease_epoch": one.lease_epoch, "lease_seconds": 3600},
                    key=f"h-{uuid.uuid4()}" if key else "",
                )

            return go

        def checkpoint() -> str:
            return call(
                "POST",
                f"/api/worker/attempts/{one.attempt_id}/checkpoint",
                auth=auth,
                body={
                    "lease_epoch": one.lease_epoch,
                    "cancel_epoch": one.cancel_epoch,
                    "step": f"s{next(steps)}",
                    "state": {"k": "v"},
                },
                key=f"k-{uuid.uuid4()}",
            )

        def batch(k: int) -> Callable[[], str]:
            body = {
                "attempts": [
                    {"attempt_id": x.attempt_id, "lease_epoch": x.lease_epoch} for x in leases[:k]
                ],
                "lease_seconds": 3600,
            }

            def go() -> str:
                # The key a client sends anyway: the route ignores it.
                return call(
                    "POST", "/api/worker/heartbeat", auth=auth, body=body, key=str(uuid.uuid4())
                )

            return go

        ops: dict[str, tuple[Callable[[], str], str, int]] = {
            "GET /api/no-such-route (floor)": (
                lambda: call("GET", "/api/no-such-route", auth=""),
                "404",
                1,
            ),
            "heartbeat, keyed (as clients send)": (heartbeat(True), "200", 1),
            "heartbeat, no key": (heartbeat(False), "200", 1),
            "checkpoint, keyed": (checkpoint, "201", 1),
        }
        try:
            resolve("/api/worker/heartbeat")
            ops["batch heartbeat, 1 attempt"] = (batch(1), "200", 1)
            ops["batch heartbeat, 10 attempts"] = (batch(10), "200", 10)
        except Resolver404:
            print("(this tree has no POST /api/worker/heartbeat)")
        counter = Counter()
        counter.count_transaction_ends(connection)
        cpu = dict.fromkeys(ops, 0.0)
        statements = dict.fromkeys(ops, 0)
        load_before = os.getloadavg()
        with connection.execute_wrapper(counter):
            for name, (fn, expect, _k) in ops.items():
                for _ in range(opts.warm):
                    status = fn()
                    if status != expect:
                        raise SystemExit(f"{name}: answered {status}, expected {expect}")
                if opts.show_sql == name:
                    counter.keep, counter.sql = True, []
                    fn()
                    counter.keep = False
                    print(f"\nSQL of one {name}:")
                    for sql in counter.sql:
                        print("  ", sql[:400])
            # Round by round: each op once per round, so a burst of load hits all alike.
            for _ in range(opts.requests):
                for name, (fn, _expect, _k) in ops.items():
                    n0 = counter.n
                    c0 = time.process_time()
                    fn()
                    cpu[name] += time.process_time() - c0
                    statements[name] += counter.n - n0
            if opts.profile:
                import cProfile
                import pstats

                fn = ops[opts.profile][0]
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(opts.requests):
                    fn()
                profile.disable()
                stats = pstats.Stats(profile)
                stats.sort_stats("cumulative").print_stats(30)
                stats.sort_stats("tottime").print_stats(20)
        load_after = os.getloadavg()
        figures: dict[str, Any] = {"load_before": load_before, "load_after": load_after, "ops": {}}
        rows = []
        for name, (_fn, _expect, k) in ops.items():
            ms = cpu[name] / opts.requests * 1000
            stmts = statements[name] / opts.requests
            figures["ops"][name] = {
                "cpu_ms": round(ms, 3),
                "cpu_ms_per_attempt": round(ms / k, 3),
                "statements": stmts,
            }
            rows.append([name, round(ms, 2), round(ms / k, 2), stmts])
        print(
            f"\nWorker calls in process, {opts.requests} rounds after {opts.warm} warm-up calls "
            f"each; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
        )
        print(table(["request", "CPU ms", "CPU ms per attempt", "statements"], rows))
        return figures


if __name__ == "__main__":
    main()
