"""The worker cycle: claim -> checkpoint -> complete, fenced, in 1, 2 and 4 worker processes.

Each worker process calls the run services directly (the in-process worker path):
``attempt_claim`` (FOR UPDATE SKIP LOCKED over the partial claim index),
``checkpoint_save`` and ``attempt_complete`` (both fenced by lease and cancel epoch
under the run lock), until no run is left. That is the worker cycle without agent
code: three committed transactions per run.

Peer in the same run: procrastinate processing the same number of trivial jobs with
the same number of worker processes (``concurrency=1`` each: one job at a time per
process, like ours), on the same PostgreSQL, at the same durability (every step its
own commit). Its cycle is two transactions (fetch, finish), ours three.

    python -m bench.worker_cycle [--runs 5000] [--workers 1,2,4] [--keep]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench import datagen
from bench.common import (
    Summary,
    declare_bench_agent,
    parse_int_list,
    save_result,
    scratch_database,
    setup_django,
    table,
    verdict,
)
from bench.load import LoadResult, Record, run_load


def holdpoint_worker(
    items: Sequence[Any], args: dict[str, Any], record: Record, ready: Callable[[], None]
) -> None:
    import os

    from runs import services
    from runs.db import db_now

    worker_id = f"bench-{os.getpid()}"
    db_now()  # open the connection before the clock starts
    ready()
    while True:
        t0 = time.perf_counter()
        lease = services.attempt_claim(worker_id=worker_id, lease_seconds=60)
        claim = time.perf_counter() - t0
        if lease is None:
            return
        epochs = {
            "attempt_id": lease.attempt_id,
            "lease_epoch": lease.lease_epoch,
            "cancel_epoch": lease.cancel_epoch,
        }
        services.checkpoint_save(**epochs, step="work", state={"done": 1})
        services.attempt_complete(**epochs, result={"ok": True})
        record(claim, "cycle")


def procrastinate_worker(
    items: Sequence[Any], args: dict[str, Any], record: Record, ready: Callable[[], None]
) -> None:
    import asyncio
    import logging

    from bench.procrastinate_peer import QUEUE, make_app, timed_fetches

    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    app = make_app(args["url"])

    async def main() -> None:
        async with app.open_async():
            await app.job_manager.check_connection_async()  # connect before the clock starts
            timed_fetches(app, record)
            ready()
            await app.run_worker_async(
                queues=[QUEUE],
                concurrency=1,
                wait=False,
                install_signal_handlers=False,
                listen_notify=False,
                delete_jobs="never",
            )

    asyncio.run(main())


def _queue_runs(url: str, count: int, start: int) -> None:
    import psycopg

    with psycopg.connect(url) as conn:
        datagen.generate(conn, kind="queued", start=start, count=count, agent="bench-agent")
        conn.commit()
        conn.execute("ANALYZE runs_run")
        conn.commit()


def _enqueue_rates(url: str, count: int) -> dict[str, float]:
    """Enqueue ``count`` each way, one transaction per item: run_start vs procrastinate defer."""
    from bench.procrastinate_peer import defer
    from runs import services

    t0 = time.monotonic()
    ids = [services.run_start(agent="bench-agent", input={"i": i}).id for i in range(count)]
    ours = time.monotonic() - t0
    theirs = defer(url, count)
    # Take them out of the way of the cycle measurements.
    from runs.models import Run

    Run.objects.filter(pk__in=ids).update(status="cancelled", not_before=None)
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM procrastinate_jobs")
    return {"run_start_per_s": count / ours, "procrastinate_defer_per_s": count / theirs}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5000, help="runs (and jobs) per measurement")
    parser.add_argument("--workers", default="1,2,4", help="worker process counts")
    parser.add_argument("--enqueue", type=int, default=1000, help="items for the enqueue rate")
    parser.add_argument("--keep", action="store_true")
    opts = parser.parse_args(argv)
    counts = parse_int_list(opts.workers)
    figures: dict[str, Any] = {"runs": opts.runs, "workers": {}}
    rows: list[list[Any]] = []

    with scratch_database("cycle", keep=opts.keep) as url:
        setup_django()
        declare_bench_agent()
        from bench.procrastinate_peer import apply_schema, defer

        apply_schema(url)
        rates = _enqueue_rates(url, opts.enqueue)
        figures["enqueue"] = {k: round(v, 1) for k, v in rates.items()}
        next_start = 1
        for workers in counts:
            _queue_runs(url, opts.runs, next_start)
            next_start += opts.runs
            ours = run_load(holdpoint_worker, [[]] * workers, {})
            defer(url, opts.runs)
            theirs = run_load(procrastinate_worker, [[]] * workers, {"url": url})
            ratio = ours.throughput / theirs.throughput if theirs.throughput else float("nan")
            figures["workers"][str(workers)] = {
                "holdpoint": ours.as_dict(),
                "procrastinate": theirs.as_dict(),
                "ratio": round(ratio, 3),
            }
            for name, result in (("holdpoint", ours), ("procrastinate", theirs)):
                s: Summary = result.summary
                rows.append(
                    [
                        workers,
                        name,
                        result.operations,
                        result.throughput,
                        s.p50,
                        s.p99,
                        result.client_cpu_ms_per_op,
                        f"{ratio:.2f}x" if name == "holdpoint" else "1.00x",
                    ]
                )
            print(
                f"  {workers} worker(s): holdpoint {ours.throughput:.0f}/s, "
                f"procrastinate {theirs.throughput:.0f}/s ({ratio:.2f}x)",
                flush=True,
            )
            _check(ours, opts.runs)

    print()
    print(f"Worker cycle over {opts.runs} runs (claim -> checkpoint -> complete) vs procrastinate")
    print(
        table(
            [
                "workers",
                "system",
                "cycles",
                "cycles/s",
                "claim/fetch p50 ms",
                "claim/fetch p99 ms",
                "worker CPU ms/cycle",
                "ratio",
            ],
            rows,
        )
    )
    print(
        f"Enqueue, one transaction each, 1 client: run_start {rates['run_start_per_s']:.0f}/s, "
        f"procrastinate defer {rates['procrastinate_defer_per_s']:.0f}/s"
    )
    checks = [
        f"{w} worker(s): {v['ratio']:.2f}x procrastinate ({verdict(v['ratio'] >= 1.0)} >= 1.0x)"
        for w, v in figures["workers"].items()
    ]
    figures["targets"] = checks
    for line in checks:
        print("  " + line)
    save_result("worker_cycle", figures)
    return figures


def _check(result: LoadResult, expected: int) -> None:
    if result.operations != expected:
        raise SystemExit(f"holdpoint workers completed {result.operations} of {expected} runs")


if __name__ == "__main__":
    main()
