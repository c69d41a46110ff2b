"""Ready -> claimed: how long an idle worker takes to pick up work that just became ready.

Ours: an idle claimer process ``LISTEN``s on ``holdpoint_work`` (what ``run_start``,
resume and retry ``NOTIFY`` inside their transaction, delivered at commit) and calls
``attempt_claim`` when woken. The latency runs from the moment the producer's
``run_start`` has committed to the moment the claimer's ``attempt_claim`` has
committed the lease.

Peer in the same run: a procrastinate worker (``listen_notify=True``, concurrency 1)
waiting on its own LISTEN/NOTIFY channel; from the moment ``defer`` has committed to
the moment the task starts running.

One item at a time, with a random 20-80 ms pause between items, so the worker is
idle each time (this measures wake-up, not throughput). Timestamps are
``time.monotonic()``, one clock for all processes on the machine.
Targets: p50 <= 10 ms, p99 <= 25 ms.

    python -m bench.wakeup [--samples 200] [--keep]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import time
from typing import Any

from bench.common import (
    Summary,
    declare_bench_agent,
    save_result,
    scratch_database,
    setup_django,
    table,
    verdict,
)


def _holdpoint_claimer(url: str, samples: int, ready: Any, out: Any) -> None:
    import psycopg

    from runs import services
    from runs.db import db_now
    from runs.events import WORK_CHANNEL

    db_now()
    listener = psycopg.connect(url, autocommit=True)
    listener.execute(f"LISTEN {WORK_CHANNEL}")
    ready.set()
    claimed = 0
    while claimed < samples:
        # Block until a NOTIFY arrives (or a second passes: then look anyway, as workers do).
        for _ in listener.notifies(timeout=1.0, stop_after=1):
            pass
        while True:
            lease = services.attempt_claim(worker_id="bench-idle", lease_seconds=60)
            if lease is None:
                break
            at = time.monotonic()
            out.put((lease.run_id, at))
            claimed += 1
            services.attempt_complete(
                attempt_id=lease.attempt_id,
                lease_epoch=lease.lease_epoch,
                cancel_epoch=lease.cancel_epoch,
                result={},
            )
    listener.close()


def _procrastinate_worker(url: str, ready: Any, out: Any) -> None:
    import asyncio
    import logging

    from bench import procrastinate_peer

    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    procrastinate_peer.ON_START = lambda i: out.put((i, time.monotonic()))
    app = procrastinate_peer.make_app(url)

    async def main() -> None:
        async with app.open_async():
            await app.job_manager.check_connection_async()
            ready.set()
            await app.run_worker_async(
                queues=[procrastinate_peer.QUEUE],
                concurrency=1,
                wait=True,
                listen_notify=True,
                install_signal_handlers=True,
                delete_jobs="never",
            )

    asyncio.run(main())


def _pause(rng: random.Random) -> None:
    time.sleep(rng.uniform(0.02, 0.08))


def measure_holdpoint(url: str, samples: int) -> list[float]:
    from django.db import connections

    from runs import services

    ctx = mp.get_context("fork")
    ready, out = ctx.Event(), ctx.Queue()
    connections.close_all()
    proc = ctx.Process(target=_holdpoint_claimer, args=(url, samples, ready, out))
    proc.start()
    ready.wait(30)
    rng = random.Random(1)
    committed: dict[str, float] = {}
    for i in range(samples):
        _pause(rng)
        run = services.run_start(agent="bench-agent", input={"i": i})
        committed[run.id] = time.monotonic()
    claimed = dict(out.get(timeout=60) for _ in range(samples))
    proc.join(30)
    return [claimed[r] - committed[r] for r in committed]


def measure_procrastinate(url: str, samples: int) -> list[float]:
    import os
    import signal

    from bench import procrastinate_peer

    ctx = mp.get_context("fork")
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_procrastinate_worker, args=(url, ready, out))
    proc.start()
    ready.wait(30)
    time.sleep(0.5)  # the worker's LISTEN is set up after open; let it settle
    app = procrastinate_peer.make_app(url)
    rng = random.Random(1)
    committed: dict[int, float] = {}
    with app.open():
        task = app.tasks["bench_noop"]
        for i in range(samples):
            _pause(rng)
            task.defer(i=i)
            committed[i] = time.monotonic()
    started = dict(out.get(timeout=60) for _ in range(samples))
    os.kill(proc.pid, signal.SIGTERM)
    proc.join(30)
    return [started[i] - committed[i] for i in committed]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--keep", action="store_true")
    opts = parser.parse_args(argv)

    with scratch_database("wakeup", keep=opts.keep) as url:
        setup_django()
        declare_bench_agent()
        from bench.procrastinate_peer import apply_schema

        apply_schema(url)
        ours = Summary.of(s * 1000 for s in measure_holdpoint(url, opts.samples))
        theirs = Summary.of(s * 1000 for s in measure_procrastinate(url, opts.samples))

    rows = [
        [
            "holdpoint (LISTEN holdpoint_work -> attempt_claim)",
            ours.n,
            ours.p50,
            ours.p95,
            ours.p99,
            ours.max,
        ],
        [
            "procrastinate (LISTEN/NOTIFY -> task starts)",
            theirs.n,
            theirs.p50,
            theirs.p95,
            theirs.p99,
            theirs.max,
        ],
    ]
    print()
    print("Ready -> claimed by an idle worker (ms)")
    print(table(["worker", "n", "p50", "p95", "p99", "max"], rows))
    checks = [
        f"p50 {ours.p50:.1f} ms ({verdict(ours.p50 <= 10)} <= 10 ms), "
        f"p99 {ours.p99:.1f} ms ({verdict(ours.p99 <= 25)} <= 25 ms); "
        f"procrastinate p50 {theirs.p50:.1f} ms, p99 {theirs.p99:.1f} ms"
    ]
    print("  " + checks[0])
    figures = {
        "holdpoint_ms": ours.as_dict(),
        "procrastinate_ms": theirs.as_dict(),
        "targets": checks,
    }
    save_result("wakeup", figures)
    return figures


if __name__ == "__main__":
    main()
