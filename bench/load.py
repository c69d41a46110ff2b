"""Closed-loop load from N client processes that start together behind a barrier.

Each client process runs ``session(items)``: a generator-style callable that does
one operation per item and returns its latency. Processes, not threads, so the
clients do not share one GIL with each other; the wall time runs from the barrier
to the last client's last operation.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.common import Summary, ms

# A client: (items, shared args, record, ready) -> None. It sets itself up (connections),
# calls ``ready()`` (the barrier: the clock starts when every client is ready), then does
# its operations, calling ``record(seconds, outcome)`` for each.
Record = Callable[[float, str], None]
Client = Callable[[Sequence[Any], dict[str, Any], Record, Callable[[], None]], None]


@dataclass
class LoadResult:
    operations: int
    wall_seconds: float
    latencies_ms: list[float]
    outcomes: dict[str, int] = field(default_factory=dict)
    # CPU seconds the client processes spent (all their threads), from ready to done.
    client_cpu_seconds: float = 0.0

    @property
    def client_cpu_ms_per_op(self) -> float:
        return self.client_cpu_seconds / self.operations * 1000 if self.operations else 0.0

    @property
    def throughput(self) -> float:
        return self.operations / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def summary(self) -> Summary:
        return Summary.of(self.latencies_ms)

    def as_dict(self) -> dict[str, Any]:
        return {
            "operations": self.operations,
            "wall_seconds": round(self.wall_seconds, 4),
            "throughput_per_s": round(self.throughput, 1),
            "latency_ms": self.summary.as_dict(),
            "outcomes": self.outcomes,
            "client_cpu_ms_per_op": round(self.client_cpu_ms_per_op, 3),
        }


def _client_main(
    client: Client,
    items: Sequence[Any],
    args: dict[str, Any],
    barrier: Any,
    results: Any,
) -> None:
    latencies: list[float] = []
    outcomes: dict[str, int] = {}

    def record(seconds: float, outcome: str) -> None:
        latencies.append(seconds)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    start = cpu = 0.0

    def ready() -> None:
        nonlocal start, cpu
        barrier.wait()
        start = time.monotonic()
        cpu = time.process_time()

    client(items, args, record, ready)
    end = time.monotonic()
    results.put((start, end, latencies, outcomes, time.process_time() - cpu))


def run_load(
    client: Client, per_client_items: Sequence[Sequence[Any]], args: dict[str, Any]
) -> LoadResult:
    """Run ``client`` in ``len(per_client_items)`` processes at once; gather the figures."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(len(per_client_items))
    results = ctx.Queue()
    # Close inherited database connections: a forked child must never share a socket.
    try:
        from django.db import connections

        connections.close_all()
    except Exception:
        pass
    procs = [
        ctx.Process(target=_client_main, args=(client, items, args, barrier, results))
        for items in per_client_items
    ]
    for proc in procs:
        proc.start()
    gathered = [results.get(timeout=900) for _ in procs]
    for proc in procs:
        proc.join()
    starts = [g[0] for g in gathered]
    ends = [g[1] for g in gathered]
    latencies = [lat for g in gathered for lat in g[2]]
    outcomes: dict[str, int] = {}
    for g in gathered:
        for key, count in g[3].items():
            outcomes[key] = outcomes.get(key, 0) + count
    return LoadResult(
        operations=len(latencies),
        wall_seconds=max(ends) - min(starts),
        latencies_ms=ms(latencies),
        outcomes=outcomes,
        client_cpu_seconds=sum(g[4] for g in gathered),
    )


def split(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """Deal ``items`` round-robin into ``parts`` lists."""
    return [list(items[i::parts]) for i in range(parts)]


def baseline_update_client(
    items: Sequence[Any], args: dict[str, Any], record: Record, ready: Callable[[], None]
) -> None:
    """The baseline: one single-row ``UPDATE …; COMMIT`` per item with raw psycopg."""
    import psycopg

    with psycopg.connect(args["url"]) as conn:
        ready()
        for row_id in items:
            t0 = time.perf_counter()
            conn.execute(
                "UPDATE bench_baseline SET n = n + 1, updated_at = now() WHERE id = %s", [row_id]
            )
            conn.commit()
            record(time.perf_counter() - t0, "ok")


def prepare_baseline_table(url: str, rows: int) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_baseline")
        conn.execute(
            "CREATE TABLE bench_baseline (id integer PRIMARY KEY, n integer NOT NULL DEFAULT 0,"
            " updated_at timestamptz)"
        )
        conn.execute(
            "INSERT INTO bench_baseline (id) SELECT g FROM generate_series(1, %s) g", [rows]
        )
        conn.execute("VACUUM ANALYZE bench_baseline")


def baseline(url: str, clients: int, operations_per_client: int) -> LoadResult:
    """Raw psycopg single-row UPDATE + COMMIT at ``clients`` concurrent clients, each on its rows."""
    prepare_baseline_table(url, clients * operations_per_client)
    ids = list(range(1, clients * operations_per_client + 1))
    return run_load(baseline_update_client, split(ids, clients), {"url": url})
