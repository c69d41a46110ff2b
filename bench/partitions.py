"""The event table partitioned by time, beside the table as it is (docs/operations.md, "Past
one PostgreSQL"): what a timeline read and the retention of a month cost in each.

Two tables with ``runs_runevent``'s columns in a scratch database: ``plain`` (its
indexes: the primary key and the unique ``(run_id, seq)``) and ``monthly``, partitioned by
``created_at`` into ``--months`` months (primary key ``(id, created_at)``, unique
``(run_id, seq, created_at)``: a unique index on a partitioned table must hold its key).
Both get the same ``--events`` rows, ``--per-run`` events a run, each run's events in one
month. Measured, in each: the time to load them; a run's timeline (``WHERE run_id = %s
ORDER BY seq``) p50/p95 over ``--reads`` random runs, from a warm cache; the bytes; and
retention of the oldest month: a batched ``DELETE`` of its rows (10,000 a batch, as the
history sweep deletes) against ``DETACH`` + ``DROP`` of its partition.

    python -m bench.partitions [--events 1M] [--months 10] [--per-run 10] [--reads 300]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from bench.common import (
    Summary,
    libpq_url,
    parse_int_list,
    save_result,
    scratch_database,
    table,
)

COLUMNS = """
    id bigint NOT NULL,
    run_id varchar(40) NOT NULL,
    seq integer NOT NULL,
    type varchar(60) NOT NULL,
    actor varchar(200) NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL
"""
START = "2026-01-01"


def create(conn: Any, months: int) -> None:
    conn.execute(f"CREATE TABLE plain ({COLUMNS}, PRIMARY KEY (id), UNIQUE (run_id, seq))")
    conn.execute(
        f"CREATE TABLE monthly ({COLUMNS}, PRIMARY KEY (id, created_at), "
        "UNIQUE (run_id, seq, created_at)) PARTITION BY RANGE (created_at)"
    )
    for m in range(months):
        conn.execute(
            f"CREATE TABLE monthly_{m} PARTITION OF monthly FOR VALUES FROM "
            f"(timestamptz '{START}' + interval '{m} month') "
            f"TO (timestamptz '{START}' + interval '{m + 1} month')"
        )


def load(conn: Any, name: str, events: int, months: int, per_run: int) -> float:
    """``events`` rows: run r has events 1..per_run, all in month r mod months."""
    runs = events // per_run
    t0 = time.perf_counter()
    conn.execute(
        f"""
        INSERT INTO {name} (id, run_id, seq, type, actor, payload, created_at)
        SELECT g, 'run_' || (g / %(per_run)s), g %% %(per_run)s + 1, 'checkpoint_saved',
               'worker:bench',
               jsonb_build_object('checkpoint_id', md5(g::text), 'step', 'work', 'n', g),
               timestamptz '{START}' + ((g / %(per_run)s) %% %(months)s) * interval '1 month'
                 + (g %% 86400) * interval '1 second'
        FROM generate_series(0, %(last)s) AS g
        """,
        {"per_run": per_run, "months": months, "last": runs * per_run - 1},
    )
    conn.execute(f"VACUUM ANALYZE {name}")
    return time.perf_counter() - t0


def timeline_ms(conn: Any, name: str, runs: int, reads: int, seed: int) -> Summary:
    rng = random.Random(seed)
    ids = [f"run_{rng.randrange(runs)}" for _ in range(reads)]
    sql = f"SELECT seq, type, payload FROM {name} WHERE run_id = %s ORDER BY seq"
    for run_id in ids[:50]:  # warm
        conn.execute(sql, [run_id]).fetchall()
    times = []
    for run_id in ids:
        t0 = time.perf_counter()
        conn.execute(sql, [run_id]).fetchall()
        times.append((time.perf_counter() - t0) * 1000)
    return Summary.of(times)


def size_bytes(conn: Any, name: str) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
        "WHERE c.relname = %s OR c.oid IN (SELECT inhrelid FROM pg_inherits "
        "WHERE inhparent = %s::regclass)",
        [name, name],
    ).fetchone()
    return int(row[0])


def retention_delete(conn: Any) -> tuple[float, int]:
    """The oldest month out of ``plain`` in batches of 10,000, as the sweep deletes."""
    t0 = time.perf_counter()
    deleted = 0
    end = f"timestamptz '{START}' + interval '1 month'"
    while True:
        cur = conn.execute(
            f"DELETE FROM plain WHERE id IN (SELECT id FROM plain WHERE created_at < {end} "
            "LIMIT 10000)"
        )
        deleted += cur.rowcount
        if cur.rowcount == 0:
            break
    return time.perf_counter() - t0, deleted


def retention_drop(conn: Any) -> float:
    t0 = time.perf_counter()
    conn.execute("ALTER TABLE monthly DETACH PARTITION monthly_0")
    conn.execute("DROP TABLE monthly_0")
    return time.perf_counter() - t0


def run(opts: argparse.Namespace) -> dict[str, Any]:
    import psycopg

    runs = opts.events // opts.per_run
    figures: dict[str, Any] = {
        "events": runs * opts.per_run,
        "months": opts.months,
        "per_run": opts.per_run,
    }
    with (
        scratch_database("partitions", keep=opts.keep) as url,
        psycopg.connect(libpq_url(url), autocommit=True) as conn,
    ):
        create(conn, opts.months)
        for name in ("plain", "monthly"):
            seconds = load(conn, name, opts.events, opts.months, opts.per_run)
            print(f"loaded {name} in {seconds:.1f} s", flush=True)
            figures[name] = {
                "load_seconds": round(seconds, 1),
                "bytes": size_bytes(conn, name),
                "timeline_ms": timeline_ms(conn, name, runs, opts.reads, opts.seed).as_dict(),
            }
        delete_s, deleted = retention_delete(conn)
        figures["plain"]["retention_month"] = {"seconds": round(delete_s, 3), "rows": deleted}
        figures["monthly"]["retention_month"] = {
            "seconds": round(retention_drop(conn), 3),
            "rows": deleted,
        }
    return figures


def report(figures: dict[str, Any]) -> None:
    rows = []
    for name, label in (("plain", "one table"), ("monthly", f"{figures['months']} partitions")):
        f = figures[name]
        rows.append(
            [
                label,
                f"{f['load_seconds']:.1f}",
                f"{f['bytes'] / figures['events']:.0f}",
                f"{f['timeline_ms']['p50']:.2f}",
                f"{f['timeline_ms']['p95']:.2f}",
                f"{f['retention_month']['seconds']:.3f}",
            ]
        )
    print(
        f"\nEvents: {figures['events']:,}, {figures['per_run']} a run, over "
        f"{figures['months']} months"
    )
    print(
        table(
            [
                "table",
                "load s",
                "bytes / event",
                "timeline p50 ms",
                "timeline p95 ms",
                "a month's retention s",
            ],
            rows,
        )
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", default="1M", help="events in each table (default 1M)")
    parser.add_argument("--months", type=int, default=10)
    parser.add_argument("--per-run", type=int, default=10)
    parser.add_argument("--reads", type=int, default=300)
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    opts = parser.parse_args(argv)
    opts.events = parse_int_list(opts.events)[0]
    figures = run(opts)
    report(figures)
    save_result("partitions", figures)
    return figures


if __name__ == "__main__":
    main()
