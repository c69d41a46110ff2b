"""Pause at the step boundary: how long from the pause's commit until the run is stopped.

Two measurements, in a scratch database, with driver threads that hold real leases and
run "steps" of ``--step-ms`` between checkpoints (each boundary is a real
``checkpoint_save`` whose answer says whether to stop, then ``attempt_release(reason=
"paused")``), as the Python worker does:

1. **Run pause -> paused**: one running attempt; ``run_pause`` commits at a random
   moment within a step; the clock stops when the release has committed the run
   ``paused``. The latency is the rest of the step plus the boundary's cost; the
   boundary's own cost (checkpoint answer -> paused) is shown apart.
2. **Agent pause -> all attempts stopped**: ``--attempts`` running attempts of one agent
   (driven by ``--threads`` threads, each over its share, so the database sees at most
   that many connections); ``agent_pause`` commits mid-step; the clock stops when the
   last attempt has released (its run ``queued``, held). Checked: no claim of the agent
   succeeded after the pause (in SQL), every run was held at a boundary.

No target is set by the issue; the figures say what a person waits for.

    python -m bench.pause [--samples 50] [--attempts 100] [--threads 10] [--step-ms 50]
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from typing import Any

from bench.common import (
    Summary,
    declare_bench_agent,
    save_result,
    scratch_database,
    setup_django,
    table,
)

AGENT = "bench-agent"


def _drive(leases: list[Any], step_s: float, stopped: dict[str, tuple[float, float]]) -> None:
    """Run steps of ``step_s`` for each lease until its boundary says stop; record when
    the boundary answered and when the release committed (monotonic seconds)."""
    from django.db import connection

    from runs import services

    live = list(leases)
    n = 0
    try:
        while live:
            time.sleep(step_s)  # the step's work, for every attempt this thread drives
            n += 1
            for lease in list(live):
                checkpoint = services.checkpoint_save(
                    attempt_id=lease.attempt_id,
                    lease_epoch=lease.lease_epoch,
                    cancel_epoch=lease.cancel_epoch,
                    step=f"s{n}",
                    state={"n": n},
                )
                if checkpoint.pause_requested:
                    at_boundary = time.monotonic()
                    services.attempt_release(
                        attempt_id=lease.attempt_id,
                        lease_epoch=lease.lease_epoch,
                        reason="paused",
                    )
                    stopped[lease.run_id] = (at_boundary, time.monotonic())
                    live.remove(lease)
    finally:
        connection.close()


def measure_run_pause(samples: int, step_s: float) -> tuple[list[float], list[float]]:
    from runs import services

    rng = random.Random(1)
    latencies, boundary = [], []
    for i in range(samples):
        run = services.run_start(agent=AGENT, input={"i": i})
        lease = services.attempt_claim(worker_id="bench", agents=[AGENT], lease_seconds=60)
        assert lease is not None and lease.run_id == run.id
        stopped: dict[str, tuple[float, float]] = {}
        driver = threading.Thread(target=_drive, args=([lease], step_s, stopped))
        driver.start()
        time.sleep(step_s * (1 + rng.random()))  # a random moment within the second step
        services.run_pause(run_id=run.id, reason="bench")
        committed = time.monotonic()
        driver.join(60)
        at_boundary, released = stopped[run.id]
        latencies.append(released - committed)
        boundary.append(released - at_boundary)
        run.refresh_from_db()
        assert run.status == "paused", run.status
    return latencies, boundary


def measure_agent_pause(attempts: int, threads: int, step_s: float) -> dict[str, Any]:
    from django.db import connection

    from runs import services
    from runs.models import AgentGate, Run

    run_ids = [services.run_start(agent=AGENT, input={"i": i}).id for i in range(attempts)]
    leases = []
    for i in range(attempts):
        lease = services.attempt_claim(worker_id=f"bench/{i}", agents=[AGENT], lease_seconds=120)
        assert lease is not None
        leases.append(lease)
    stopped: dict[str, tuple[float, float]] = {}
    drivers = [
        threading.Thread(target=_drive, args=(leases[t::threads], step_s, stopped))
        for t in range(threads)
    ]
    for driver in drivers:
        driver.start()
    time.sleep(step_s * 2.5)
    # More work arrives for the agent while it is paused: it must wait.
    late = [services.run_start(agent=AGENT, input={"late": i}).id for i in range(5)]
    started = time.monotonic()
    services.agent_pause(agent=AGENT, reason="bench")
    committed = time.monotonic()
    claimed = services.attempt_claim(worker_id="bench-late", agents=[AGENT])
    for driver in drivers:
        driver.join(120)
    gate = AgentGate.objects.get(pk=AGENT)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM runs_attempt a JOIN runs_run r ON r.id = a.run_id "
            "WHERE r.agent = %s AND a.started_at >= %s",
            [AGENT, gate.paused_at],
        )
        (claimed_after,) = cursor.fetchone()
    held = Run.objects.filter(
        pk__in=run_ids, status="queued", current_attempt__reason="held"
    ).count()
    # From the moment the pause was asked: the gate commits inside the call, and attempts
    # that reach a boundary after that commit stop before the call returns.
    stops = [released - started for _, released in stopped.values()]
    services.agent_unpause(agent=AGENT)
    for run_id in run_ids + late:
        services.run_cancel(run_id=run_id)
    return {
        "attempts": attempts,
        "threads": threads,
        "pause_call_ms": (committed - started) * 1000,
        "all_stopped_ms": max(stops) * 1000,
        "after_call_ms": (max(stops) - (committed - started)) * 1000,
        "stop_ms": Summary.of(s * 1000 for s in stops),
        "held_at_boundary": held,
        "claims_while_paused": int(claimed_after) + (1 if claimed is not None else 0),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--attempts", type=int, default=100)
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--keep", action="store_true")
    opts = parser.parse_args(argv)
    step_s = opts.step_ms / 1000
    with scratch_database("pause", keep=opts.keep):
        setup_django()
        declare_bench_agent(AGENT)
        latencies, boundary = measure_run_pause(opts.samples, step_s)
        gate = measure_agent_pause(opts.attempts, opts.threads, step_s)
    run_ms = Summary.of(s * 1000 for s in latencies)
    boundary_ms = Summary.of(s * 1000 for s in boundary)
    stop = gate["stop_ms"]
    print()
    print(f"Pause -> paused at the step boundary (ms; steps of {opts.step_ms:g} ms)")
    print(
        table(
            ["measure", "n", "p50", "p95", "p99", "max"],
            [
                [
                    "run pause committed -> run paused",
                    run_ms.n,
                    run_ms.p50,
                    run_ms.p95,
                    run_ms.p99,
                    run_ms.max,
                ],
                [
                    "boundary: checkpoint answer -> paused",
                    boundary_ms.n,
                    boundary_ms.p50,
                    boundary_ms.p95,
                    boundary_ms.p99,
                    boundary_ms.max,
                ],
                [
                    f"agent pause asked -> each of {gate['attempts']} attempts stopped",
                    stop.n,
                    stop.p50,
                    stop.p95,
                    stop.p99,
                    stop.max,
                ],
            ],
        )
    )
    print(
        f"  agent pause of {gate['attempts']} running attempts ({gate['threads']} driver "
        f"threads): agent_pause call {gate['pause_call_ms']:.1f} ms, all stopped "
        f"{gate['all_stopped_ms']:.1f} ms after it was asked; held at a boundary "
        f"{gate['held_at_boundary']}/{gate['attempts']}; claims while paused "
        f"{gate['claims_while_paused']} (must be 0)"
    )
    figures = {
        "step_ms": opts.step_ms,
        "run_pause_ms": run_ms.as_dict(),
        "boundary_ms": boundary_ms.as_dict(),
        "agent_pause": {**gate, "stop_ms": stop.as_dict()},
    }
    save_result("pause", figures)
    return figures


if __name__ == "__main__":
    main()
