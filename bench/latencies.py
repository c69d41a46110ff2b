"""Latencies people feel, through the real worker runtime (``manage.py runagents``).

- **resume -> running again**: ``POST /api/runs/{id}/resume`` over HTTP (daphne, token)
  on a run waiting at a question, to the moment the resumed step runs again (the
  step writes ``time.time()`` into its next checkpoint). Target p50 <= 100 ms.
- **cancel -> stopped**: ``POST /api/runs/{id}/cancel`` on a run whose step is working
  (sleeping in ``ctx.sleep``, a safe point), to the moment the worker acknowledged the
  stop (``attempt.ended_at``, written by ``attempt_release``). Target p99 <= 100 ms.
- **recovery**: ``SIGKILL`` of the worker process holding a run, to the first
  checkpoint of the run's next attempt, next to the configured lease + sweep interval
  (the lease must run out and a sweep must notice before anyone may take over).

Two worker processes (``--concurrency 1``) run the ``bench-latency`` agent
(``bench/agents.py``). Times are wall-clock (``time.time()`` and the database's clock,
one machine).

    python -m bench.latencies [--samples 30] [--kills 5] [--lease-seconds 5] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import time
import uuid
from typing import Any

from bench.common import (
    PYTHON,
    ROOT,
    Summary,
    daphne,
    person,
    save_result,
    scratch_database,
    setup_django,
    table,
    verdict,
)

AGENT = "bench-latency"


def runtime_available() -> bool:
    return (ROOT / "runtime" / "management" / "commands" / "runagents.py").exists()


class Pool:
    def __init__(self, count: int, lease: float, sweep: float) -> None:
        self.command = [
            PYTHON,
            "manage.py",
            "runagents",
            "--concurrency",
            "1",
            "--agents",
            AGENT,
            "--lease-seconds",
            str(lease),
            "--sweep-interval",
            str(sweep),
        ]
        self.env = {
            **os.environ,
            "HOLDPOINT_AGENT_MODULES": "runtime.demo_agents,bench.agents",
            "LOG_LEVEL": "WARNING",
        }
        self.procs = [self.spawn() for _ in range(count)]

    def spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def kill(self, pid: int) -> None:
        for i, proc in enumerate(self.procs):
            if proc.pid == pid:
                os.kill(pid, signal.SIGKILL)
                proc.wait()
                self.procs[i] = self.spawn()
                return
        raise LookupError(pid)

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    raise SystemExit(f"timed out waiting for {what}")


def measure_resume(http: Any, samples: int) -> list[float]:
    from runs import services
    from runs.models import Checkpoint, InputRequest

    runs = [
        services.run_start(agent=AGENT, input={"ask": True, "steps": 1}).id for _ in range(samples)
    ]
    out = []
    for run_id in runs:
        request = _wait(
            lambda run_id=run_id: InputRequest.objects.filter(
                run_id=run_id, status="pending"
            ).first(),
            60,
            "the question",
        )
        time.sleep(0.05)
        t0 = time.time()
        response = http.post(
            f"/api/runs/{run_id}/resume",
            json={
                "request_id": request.id,
                "checkpoint_id": request.checkpoint_id,
                "value": {"go": True},
            },
            headers={"Idempotency-Key": str(uuid.uuid4())},
        )
        assert response.status_code == 202, response.text
        checkpoint = _wait(
            lambda run_id=run_id: Checkpoint.objects.filter(run_id=run_id, step="work").first(),
            60,
            "the resumed step",
        )
        out.append(checkpoint.state["running_at"] - t0)
    return out


def measure_cancel(http: Any, samples: int) -> list[float]:
    from runs import services
    from runs.models import Attempt, Checkpoint, Run

    out = []
    for _ in range(samples):
        run = services.run_start(agent=AGENT, input={"steps": 100000, "step_seconds": 0.05})
        # Working: past its first checkpoint, in the middle of a step's ctx.sleep.
        _wait(
            lambda run=run: Checkpoint.objects.filter(run=run, number__gte=2).exists(), 60, "work"
        )
        time.sleep(0.02)
        t0 = time.time()
        response = http.post(
            f"/api/runs/{run.id}/cancel",
            json={"reason": "bench"},
            headers={"Idempotency-Key": str(uuid.uuid4())},
        )
        assert response.status_code == 202, response.text
        _wait(
            lambda run=run: Run.objects.filter(pk=run.pk, status="cancelled").exists(), 60, "stop"
        )
        attempt = Attempt.objects.filter(run=run).order_by("-number").first()
        assert attempt is not None and attempt.ended_at is not None
        out.append(attempt.ended_at.timestamp() - t0)
    return out


def measure_recovery(pool: Pool, kills: int) -> list[float]:
    from runs import services
    from runs.models import Attempt, Checkpoint

    out = []
    for _ in range(kills):
        run = services.run_start(agent=AGENT, input={"steps": 100000, "step_seconds": 0.05})
        attempt = _wait(
            lambda run=run: Attempt.objects.filter(run=run, status="running").first(), 60, "claim"
        )
        _wait(
            lambda run=run: Checkpoint.objects.filter(run=run, number__gte=2).exists(), 60, "work"
        )
        pid = int(attempt.worker_id.rsplit(":", 1)[1].split("/")[0])
        t0 = time.time()
        pool.kill(pid)
        checkpoint = _wait(
            lambda run=run, attempt=attempt: (
                Checkpoint.objects.filter(run=run)
                .exclude(attempt=attempt)
                .order_by("number")
                .first()
            ),
            120,
            "the next attempt's first checkpoint",
        )
        out.append(checkpoint.created_at.timestamp() - t0)
        services.run_cancel(run_id=run.id, actor="system:bench")
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--lease-seconds", type=float, default=5.0)
    parser.add_argument("--sweep-seconds", type=float, default=1.0)
    parser.add_argument("--keep", action="store_true")
    opts = parser.parse_args(argv)
    if not runtime_available():
        print("bench.latencies: the worker runtime (manage.py runagents) is not installed; skipped")
        figures: dict[str, Any] = {"skipped": "no worker runtime"}
        save_result("latencies", figures)
        return figures

    import httpx

    with scratch_database("latency", keep=opts.keep) as url:
        os.environ["HOLDPOINT_AGENT_MODULES"] = "runtime.demo_agents,bench.agents"
        setup_django()
        _user, token = person("bench-latency", "admin")
        pool = Pool(2, opts.lease_seconds, opts.sweep_seconds)
        try:
            with (
                daphne() as server,
                httpx.Client(
                    base_url=server.base, headers={"Authorization": f"Token {token}"}, timeout=30
                ) as http,
            ):
                time.sleep(2)  # workers start, LISTEN
                resume = Summary.of(s * 1000 for s in measure_resume(http, opts.samples))
                cancel = Summary.of(s * 1000 for s in measure_cancel(http, opts.samples))
            recovery = Summary.of(measure_recovery(pool, opts.kills))
        finally:
            pool.stop()
        del url

    bound = opts.lease_seconds + opts.sweep_seconds
    print()
    print("Latencies people feel (through runagents workers)")
    print(
        table(
            ["path", "n", "p50", "p95", "p99", "max", "unit"],
            [
                [
                    "resume request -> step running again",
                    resume.n,
                    resume.p50,
                    resume.p95,
                    resume.p99,
                    resume.max,
                    "ms",
                ],
                [
                    "cancel request -> worker stopped at a safe point",
                    cancel.n,
                    cancel.p50,
                    cancel.p95,
                    cancel.p99,
                    cancel.max,
                    "ms",
                ],
                [
                    "SIGKILL -> next attempt's first checkpoint",
                    recovery.n,
                    recovery.p50,
                    recovery.p95,
                    recovery.p99,
                    recovery.max,
                    "s",
                ],
            ],
        )
    )
    checks = [
        f"resume p50 {resume.p50:.0f} ms ({verdict(resume.p50 <= 100)} <= 100 ms)",
        f"cancel p99 {cancel.p99:.0f} ms ({verdict(cancel.p99 <= 100)} <= 100 ms)",
        f"recovery p50 {recovery.p50:.2f} s, max {recovery.max:.2f} s, next to lease "
        f"{opts.lease_seconds:g} s + sweep interval {opts.sweep_seconds:g} s = {bound:g} s",
    ]
    for line in checks:
        print("  " + line)
    figures = {
        "resume_ms": resume.as_dict(),
        "cancel_ms": cancel.as_dict(),
        "recovery_s": recovery.as_dict(),
        "lease_seconds": opts.lease_seconds,
        "sweep_seconds": opts.sweep_seconds,
        "targets": checks,
    }
    save_result("latencies", figures)
    return figures


if __name__ == "__main__":
    main()
