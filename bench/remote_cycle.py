"""The remote worker's cycle next to the in-process one: claim -> checkpoint -> complete.

Three ways through the same cycle, one worker each, on the same scratch database:

- **in-process**: the run services called directly (what ``runagents`` does);
- **HTTP**: the worker protocol by hand (httpx, one connection kept alive) against one
  daphne process: ``POST /api/worker/claim``, ``…/checkpoint``, ``…/complete``;
- **Python client**: ``holdpoint_client.Worker`` running a one-step agent (the long-poll
  claim, the first checkpoint, the heartbeat thread per attempt, complete).

    python -m bench.remote_cycle [--runs 500] [--keep]

The figure to read is the ratio of each remote way to in-process, measured in the same
run (absolute times on a shared machine are noise).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import (
    Summary,
    daphne,
    ms,
    save_result,
    scratch_database,
    setup_django,
    table,
)


def _start_runs(agent: str, count: int) -> list[str]:
    from runs import services

    return [services.run_start(agent=agent, input={"i": i}).id for i in range(count)]


def in_process(count: int) -> tuple[float, list[float]]:
    from runs import services

    _start_runs("bench-remote", count)
    cycles: list[float] = []
    t0 = time.perf_counter()
    while True:
        c0 = time.perf_counter()
        lease = services.attempt_claim(worker_id="bench-in-process", lease_seconds=60)
        if lease is None:
            break
        epochs = {
            "attempt_id": lease.attempt_id,
            "lease_epoch": lease.lease_epoch,
            "cancel_epoch": lease.cancel_epoch,
        }
        services.checkpoint_save(**epochs, step="work", state={"done": 1})
        services.attempt_complete(**epochs, result={"ok": True})
        cycles.append(time.perf_counter() - c0)
    return time.perf_counter() - t0, cycles


def over_http(base: str, token: str, count: int) -> tuple[float, list[float]]:
    import httpx

    _start_runs("bench-remote", count)
    cycles: list[float] = []
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        t0 = time.perf_counter()
        while True:
            c0 = time.perf_counter()
            claimed = client.post(
                "/api/worker/claim", json={"worker_id": "bench-http", "lease_seconds": 60}
            )
            if claimed.status_code == 204:
                break
            lease = claimed.json()
            epochs = {"lease_epoch": lease["lease_epoch"], "cancel_epoch": lease["cancel_epoch"]}
            url = f"/api/worker/attempts/{lease['attempt_id']}"
            client.post(f"{url}/checkpoint", json={**epochs, "step": "work", "state": {"done": 1}})
            client.post(f"{url}/complete", json={**epochs, "result": {"ok": True}})
            cycles.append(time.perf_counter() - c0)
        return time.perf_counter() - t0, cycles


def with_client(base: str, token: str, count: int) -> float:
    from holdpoint_client import Agent, Worker

    from runs.models import Run

    agent = Agent(name="bench-client")

    @agent.step
    def work(ctx: Any, state: Any) -> Any:
        return ctx.done({"ok": True})

    worker = Worker(base, token, [agent], lease_seconds=60, wait=1.0, name="bench-client")
    worker.start()  # declares the agent
    try:
        ids = _start_runs("bench-client", count)
        t0 = time.perf_counter()
        while Run.objects.filter(pk__in=ids, status="succeeded").count() < count:
            time.sleep(0.05)
        return time.perf_counter() - t0
    finally:
        worker.stop(grace=2)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--keep", action="store_true")
    opts = parser.parse_args(argv)
    figures: dict[str, Any] = {"runs": opts.runs}
    with scratch_database("remote", keep=opts.keep) as _url:
        setup_django()
        from runs import services
        from runs.tokens import worker_token_create

        services.agent_declare(name="bench-remote", actor="bench", owners=["bench-remote"])
        _, token = worker_token_create(name="bench-remote")
        local_s, local = in_process(opts.runs)
        with daphne() as server:
            http_s, remote = over_http(server.base, token, opts.runs)
            client_s = with_client(server.base, token, opts.runs)
    rows = []
    for name, seconds, cycles in (
        ("in-process (services)", local_s, local),
        ("HTTP worker protocol", http_s, remote),
        ("Python client (holdpoint_client)", client_s, []),
    ):
        summary = Summary.of(ms(cycles)) if cycles else None
        rate = opts.runs / seconds
        figures[name] = {
            "cycles_per_s": round(rate, 1),
            "cycle_ms": summary.as_dict() if summary else None,
            "ratio_to_in_process": round(rate / (opts.runs / local_s), 3),
        }
        rows.append(
            [
                name,
                opts.runs,
                rate,
                summary.p50 if summary else float("nan"),
                summary.p99 if summary else float("nan"),
                f"{rate / (opts.runs / local_s):.2f}x",
            ]
        )
    print(f"Worker cycle over {opts.runs} runs, one worker: remote next to in-process")
    print(
        table(["way", "cycles", "cycles/s", "cycle p50 ms", "cycle p99 ms", "vs in-process"], rows)
    )
    save_result("remote_cycle", figures)
    return figures


if __name__ == "__main__":
    main()
