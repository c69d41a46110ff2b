"""Real ``manage.py runagents`` processes on PostgreSQL: several workers, SIGKILL, SIGSTOP,
SIGTERM, cancel, a poison step, and NOTIFY wake-ups.

The test process and its workers share the committed test database
(``transactional_db``) and a journal file that the agents in ``tests.runtime.agents``
append to, which says which process ran which step of which attempt, and when.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

import tests.runtime.agents  # noqa: F401 - registers the proc-* agents here too
from ledger.models import SideEffect
from runs import services
from runs.models import Attempt, Checkpoint, Run, RunEvent
from runs.states import HOLDING, TERMINAL
from tests.waiting import timed_wait, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]

LEASE = 2.0


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "journal.jsonl"
    path.touch()
    return path


def read_journal(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def entries(path: Path, event: str, **match: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in read_journal(path)
        if e["event"] == event and all(e.get(k) == v for k, v in match.items())
    ]


@pytest.fixture
def tool_dir(tmp_path: Path) -> Path:
    """The folder tool's "external system" (tests.runtime.agents.FolderTool)."""
    path = tmp_path / "tool"
    path.mkdir()
    return path


def executions(tool_dir: Path) -> list[str]:
    log = tool_dir / "executions.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def spawn(
    transactional_db: None, tmp_path: Path, tool_dir: Path
) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []
    env = {
        **os.environ,
        "HOLDPOINT_TEST_TOOL_DIR": str(tool_dir),
        "DATABASE_URL": database_url(),
        "HOLDPOINT_AGENT_MODULES": "runtime.demo_agents,tests.runtime.agents",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "INFO",
        "LOG_FORMAT": "text",
    }

    def start(
        name: str,
        *,
        concurrency: int = 1,
        lease: float = LEASE,
        extra: tuple[str, ...] = (),
        may_die: bool = False,
    ) -> Worker:
        log_path = tmp_path / f"{name}.log"
        proc = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runagents",
                "--concurrency",
                str(concurrency),
                "--lease-seconds",
                str(lease),
                "--sweep-interval",
                "0.2",
                "--name",
                name,
                *extra,
            ],
            cwd=settings.BASE_DIR,
            env=env,
            stdout=log_path.open("wb"),
            stderr=subprocess.STDOUT,
        )
        worker = Worker(name, proc, log_path)
        started.append(worker)
        wait_for(
            lambda: f"runagents {name}:" in worker.log() or not worker.alive(),
            20,
            f"worker {name} to start",
        )
        assert may_die or worker.alive(), worker.log()
        return worker

    yield start
    for worker in started:
        if worker.alive():
            os.kill(worker.pid, signal.SIGCONT)
            worker.proc.kill()
        worker.proc.wait(10)


def status(run_id: str) -> str:
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).get()


def start_run(agent: str, **input: Any) -> str:
    return services.run_start(agent=agent, input=input).id


def test_several_workers_bring_every_run_to_a_final_or_waiting_state(spawn, journal) -> None:
    workers = [spawn(f"many{i}", concurrency=2) for i in range(3)]
    run_ids = [
        start_run("proc-steps", journal=str(journal), n=n, ask=n % 6 == 0, flaky=n % 5 == 0)
        for n in range(24)
    ]
    settled = set(TERMINAL) | set(HOLDING)
    wait_for(
        lambda: Run.objects.filter(pk__in=run_ids, status__in=settled).count() == len(run_ids),
        60,
        "every run to reach a final or waiting state",
    )
    runs = {r.id: r for r in Run.objects.filter(pk__in=run_ids)}
    for n, run_id in enumerate(run_ids):
        expected = "input_required" if n % 6 == 0 else "succeeded"
        assert runs[run_id].status == expected, (n, runs[run_id].failure_detail)

    # No attempt ran in two places, and no two attempts of a run ran at the same time.
    spans = entries(journal, "span")
    where = defaultdict(set)
    by_run = defaultdict(list)
    for span in spans:
        where[span["attempt_id"]].add((span["pid"], span["thread"]))
        by_run[span["run_id"]].append((span["t0"], span["t1"], span["attempt_id"]))
    assert all(len(places) == 1 for places in where.values())
    for run_spans in by_run.values():
        run_spans.sort()
        for (_, end, _), (begin, _, _) in pairwise(run_spans):
            assert begin >= end
    claims = Counter(
        e.payload["attempt_id"] for e in RunEvent.objects.filter(type="attempt.claimed")
    )
    assert set(claims.values()) == {1}
    assert len({s["pid"] for s in spans}) == 3, "the work was shared by the three processes"

    # Answer the questions through the services the API calls, and watch them finish.
    for run_id in [rid for n, rid in enumerate(run_ids) if n % 6 == 0]:
        run = Run.objects.get(pk=run_id)
        request = run.pending_request
        services.run_resume(
            run_id=run_id,
            request_id=request.id,
            checkpoint_id=request.checkpoint_id,
            value={"go": True},
        )
    wait_for(
        lambda: Run.objects.filter(pk__in=run_ids, status="succeeded").count() == len(run_ids),
        30,
        "the answered runs to finish",
    )
    assert all(w.alive() for w in workers)


def test_a_killed_worker_s_attempt_goes_on_elsewhere_from_the_last_checkpoint(
    spawn, journal
) -> None:
    first = spawn("doomed")
    run_id = start_run("proc-crash", journal=str(journal), hang=60)
    wait_for(lambda: entries(journal, "entered", attempt=1), 10, "the step to start")
    second = spawn("survivor")
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(5)
    killed_at = time.monotonic()
    wait_for(lambda: status(run_id) == "succeeded", LEASE + 10, "the run to finish elsewhere")
    assert time.monotonic() - killed_at < LEASE + 5

    run = Run.objects.get(pk=run_id)
    assert run.result == {"prepared_by": first.pid, "finished_by": second.pid, "attempt": 2}
    lost, resumed = Attempt.objects.filter(run=run).order_by("number")
    assert (lost.status, lost.worker_id) == ("lost", "doomed/1")
    assert (resumed.reason, resumed.worker_id) == ("lease_expired", "survivor/1")
    assert resumed.resume_from.step == "work"
    # The step before the crash is not run again: its checkpoint carried its work.
    assert len(entries(journal, "prepare")) == 1
    assert [e["pid"] for e in entries(journal, "entered")] == [first.pid, second.pid]


def test_a_frozen_worker_that_wakes_late_is_refused_and_changes_nothing(spawn, journal) -> None:
    frozen = spawn("frozen")
    run_id = start_run("proc-crash", journal=str(journal), hang=1.0)
    wait_for(lambda: entries(journal, "entered", attempt=1), 10, "the step to start")
    os.kill(frozen.pid, signal.SIGSTOP)
    other = spawn("other")
    wait_for(lambda: status(run_id) == "succeeded", LEASE + 10, "another worker to finish")
    run = Run.objects.get(pk=run_id)
    events_before = list(RunEvent.objects.filter(run=run).values_list("seq", "type", "actor"))

    os.kill(frozen.pid, signal.SIGCONT)
    # The frozen step finishes its work and tries to complete the run it no longer owns.
    wait_for(lambda: entries(journal, "finishing", attempt=1), 10, "the frozen step to go on")
    wait_for(lambda: "stale_worker" in frozen.log(), 10, "the refusal")
    time.sleep(0.5)
    run.refresh_from_db()
    assert run.status == "succeeded"
    assert run.result["finished_by"] == other.pid
    assert (
        list(RunEvent.objects.filter(run=run).values_list("seq", "type", "actor")) == events_before
    )
    assert Attempt.objects.get(run=run, number=1).status == "lost"
    assert frozen.alive(), "a refused worker goes back to work, it does not crash"


def test_a_cancel_stops_the_worker_within_one_heartbeat_interval(spawn, journal) -> None:
    lease = 6.0  # heartbeats every 2 s: the cancel must arrive before the next one
    worker = spawn("cancelled", lease=lease)
    run_id = start_run("proc-wait", journal=str(journal))
    wait_for(lambda: entries(journal, "entered"), 10, "the step to start")
    services.run_cancel(run_id=run_id, reason="wrong environment")
    took = timed_wait(lambda: status(run_id) == "cancelled", lease, "the run to be cancelled")
    assert took < lease / 3
    run = Run.objects.get(pk=run_id)
    assert run.failure_class == "cancelled"
    assert Attempt.objects.get(run=run).status == "aborted"
    types = list(RunEvent.objects.filter(run=run).values_list("type", "actor"))
    assert types[-2:] == [
        ("run.cancel_requested", "system"),
        ("run.cancelled", "worker:cancelled/1"),
    ]
    assert not entries(journal, "woke") and not entries(journal, "after")
    assert worker.alive()


def test_a_busy_step_is_cancelled_at_its_end_and_its_result_is_dropped(spawn, journal) -> None:
    spawn("busy", lease=6.0)
    run_id = start_run("proc-crash", journal=str(journal), hang=1.0)
    wait_for(lambda: entries(journal, "entered"), 10, "the step to start")
    services.run_cancel(run_id=run_id)
    wait_for(lambda: status(run_id) == "cancelled", 6, "the run to be cancelled")
    assert entries(journal, "finishing"), "the step ran to its end (it never calls ctx)"
    run = Run.objects.get(pk=run_id)
    assert run.result is None
    cancel_seq = RunEvent.objects.get(run=run, type="run.cancel_requested").seq
    after = list(
        RunEvent.objects.filter(run=run, seq__gt=cancel_seq).values_list("type", flat=True)
    )
    assert after == ["run.cancelled"]
    assert Checkpoint.objects.filter(run=run).count() == 2  # prepare's and work's, none later


def test_a_step_that_kills_its_worker_every_time_stops_with_lease_lost(spawn, journal) -> None:
    run_id = start_run("proc-poison", journal=str(journal))
    for i in range(4):
        if status(run_id) == "failed":
            break
        worker = spawn(f"victim{i}", lease=1.0, may_die=True)
        # Either the step kills this worker, or the run has already failed.
        wait_for(lambda: not worker.alive() or status(run_id) == "failed", 15, "the crash")
    wait_for(lambda: status(run_id) == "failed", 10, "the lease-loss cap")
    run = Run.objects.get(pk=run_id)
    assert run.failure_class == "lease_lost"
    assert list(Attempt.objects.filter(run=run).values_list("status", flat=True)) == [
        "lost",
        "lost",
    ]
    assert len(entries(journal, "entered")) == 2


def test_an_idle_worker_wakes_at_once_on_notify(spawn) -> None:
    worker = spawn("idle", extra=("--poll-interval", "30"))
    assert "LISTEN/NOTIFY" in worker.log()
    time.sleep(0.5)
    run_id = start_run("proc-quick")
    took = timed_wait(lambda: status(run_id) == "succeeded", 10, "the run to finish")
    assert took < 1.0
    assert Run.objects.get(pk=run_id).result == {"pid": worker.pid}


def test_sigterm_finishes_the_step_releases_the_lease_and_exits(spawn, journal) -> None:
    leaving = spawn("leaving")
    run_id = start_run("proc-steps", journal=str(journal), n=7, slow=1.0)
    wait_for(lambda: status(run_id) == "running", 10, "the run to be claimed")
    time.sleep(0.3)  # inside step "one"
    leaving.proc.send_signal(signal.SIGTERM)
    assert leaving.proc.wait(10) == 0
    assert "stopped" in leaving.log()
    run = Run.objects.get(pk=run_id)
    assert run.status == "queued"  # released, not left to expire
    released, queued = Attempt.objects.filter(run=run).order_by("number")
    assert (released.status, released.error_message) == ("aborted", "released: shutdown")
    assert queued.resume_from.step == "two"  # the step finished and was checkpointed

    staying = spawn("staying")
    wait_for(lambda: status(run_id) == "succeeded", 10, "another worker to finish")
    run.refresh_from_db()
    assert run.result["by"] == staying.pid
    assert [s["step"] for s in entries(journal, "span")] == ["one", "two", "three"]


def effect_of(run_id: str) -> SideEffect:
    return SideEffect.objects.get(run_id=run_id)


def test_a_side_effect_in_flight_when_its_worker_is_killed_is_looked_up_not_repeated(
    spawn, journal, tool_dir
) -> None:
    doomed = spawn("doomed-fx")
    # The action happens at once; the answer would take a minute to come back.
    run_id = start_run("proc-effect", journal=str(journal), delay_after=60)
    wait_for(lambda: list(tool_dir.glob("*.done")), 10, "the action to happen")
    survivor = spawn("survivor-fx")
    doomed.proc.send_signal(signal.SIGKILL)
    doomed.proc.wait(5)
    wait_for(lambda: status(run_id) == "succeeded", LEASE + 10, "the run to finish elsewhere")

    run = Run.objects.get(pk=run_id)
    assert run.result == {"ref": f"rec-{doomed.pid}", "finished_by": survivor.pid}
    effect = effect_of(run_id)
    assert executions(tool_dir) == [f"{effect.idempotency_key} {doomed.pid}"]
    assert (effect.status, effect.late, effect.external_reference) == (
        "confirmed",
        False,
        f"rec-{doomed.pid}",
    )
    # Confirmed by a look-up by key (the survivor's, or the reconciler's sweep that found
    # the pending effect of a dead worker first), never by acting again.
    confirmed = RunEvent.objects.get(run=run, type="side_effect.confirmed")
    assert confirmed.actor in ("system:reconciler", "worker:survivor-fx/1")
    (acted,) = entries(journal, "acted")
    assert acted["pid"] == survivor.pid
    assert acted["decision"] in ("look_up", "reuse")
    lost, resumed = Attempt.objects.filter(run=run).order_by("number")
    assert (lost.status, resumed.reason) == ("lost", "lease_expired")


def test_a_frozen_worker_s_late_outcome_is_recorded_flagged_and_changes_no_run_state(
    spawn, journal, tool_dir
) -> None:
    frozen = spawn("frozen-fx")
    # The external system takes 3 s; the worker is frozen meanwhile, past its lease.
    run_id = start_run("proc-effect", journal=str(journal), delay_before=3)
    wait_for(lambda: list(tool_dir.glob("*.inflight")), 10, "the request to be in flight")
    os.kill(frozen.pid, signal.SIGSTOP)
    other = spawn("other-fx")
    # The new worker asks the external system, which cannot tell yet: the run stops.
    wait_for(lambda: status(run_id) == "failed", LEASE + 10, "the new worker's verdict")
    run = Run.objects.get(pk=run_id)
    assert run.failure_class == "side_effect_unknown"
    assert Attempt.objects.get(run=run, number=2).worker_id == "other-fx/1"
    assert effect_of(run_id).status == "unknown"

    def run_state() -> dict[str, Any]:
        current = Run.objects.get(pk=run_id)
        return {
            "status": current.status,
            "lease_epoch": current.lease_epoch,
            "checkpoints": list(Checkpoint.objects.filter(run=run).values_list("id", flat=True)),
            "attempts": list(Attempt.objects.filter(run=run).values_list("id", "status")),
        }

    before = run_state()
    os.kill(frozen.pid, signal.SIGCONT)
    wait_for(lambda: effect_of(run_id).status == "confirmed", 10, "the late outcome")
    wait_for(lambda: "stale_worker" in frozen.log(), 10, "the refusal of its next write")
    effect = effect_of(run_id)
    assert (effect.late, effect.external_reference) == (True, f"rec-{frozen.pid}")
    assert RunEvent.objects.filter(run=run, type="side_effect.late_outcome").count() == 1
    assert run_state() == before

    # The refused worker is healthy: it stops cleanly when asked.
    frozen.proc.send_signal(signal.SIGTERM)
    assert frozen.proc.wait(10) == 0

    # Settled by the late fact, the run may be retried; the effect is reused, not repeated.
    services.run_retry(run_id=run_id, reason="the late outcome settled it")
    wait_for(lambda: status(run_id) == "succeeded", 10, "the retry")
    run.refresh_from_db()
    assert run.result == {"ref": f"rec-{frozen.pid}", "finished_by": other.pid}
    assert len(executions(tool_dir)) == 1
    assert entries(journal, "acted")[-1]["decision"] == "reuse"


def _release_step(path: Path) -> None:
    path.write_text("go")


def test_a_pause_mid_step_lets_the_step_finish_once_and_pauses_at_the_next_checkpoint(
    spawn, journal, tool_dir, tmp_path
) -> None:
    lease = 6.0  # heartbeats every 2 s
    spawn("pausing", lease=lease)
    go = tmp_path / "go"
    run_id = start_run("proc-pause", journal=str(journal), go=str(go))
    wait_for(lambda: entries(journal, "entered"), 15, "the step to start")
    run = services.run_pause(run_id=run_id, reason="look before the next step")
    assert run.status == "pause_requested"
    _release_step(go)
    wait_for(lambda: status(run_id) == "paused", 15, "the run to pause")
    finished = entries(journal, "finished")
    assert len(finished) == 1 and finished[0]["decision"] == "act"
    assert len(executions(tool_dir)) == 1  # the side effect happened, once
    assert not entries(journal, "after")
    run = Run.objects.get(pk=run_id)
    request = run.pending_request
    assert request is not None and request.kind == "pause"
    checkpoint = Checkpoint.objects.get(pk=request.checkpoint_id)
    assert checkpoint.step == "after" and run.latest_checkpoint_id == checkpoint.id
    # Paused within one heartbeat of the step's end.
    paused_at = RunEvent.objects.get(run=run, type="run.paused").created_at.timestamp()
    assert paused_at - finished[0]["t"] < lease / 3
    types = list(RunEvent.objects.filter(run=run).values_list("type", flat=True))
    second_checkpoint = types.index("checkpoint.saved", types.index("checkpoint.saved") + 1)
    assert types.index("run.pause_requested") < second_checkpoint < types.index("run.paused")
    assert Attempt.objects.get(pk=request.attempt_id).status == "interrupted"

    services.run_resume(run_id=run_id, request_id=request.id, checkpoint_id=checkpoint.id)
    wait_for(lambda: status(run_id) == "succeeded", 15, "the run to go on and finish")
    assert len(entries(journal, "entered")) == 1  # the step before the pause never re-ran
    assert len(entries(journal, "after")) == 1
    assert len(executions(tool_dir)) == 1
    assert SideEffect.objects.filter(run_id=run_id).count() == 1
    assert Run.objects.get(pk=run_id).result["ref"].startswith("rec-")


def test_the_agent_gate_stops_two_workers_at_boundaries_holds_claims_and_reopens(
    spawn, journal
) -> None:
    from runs.models import AgentGate

    # A long lease: on a loaded machine a 2 s lease is lost now and then, and a lost lease
    # re-runs its step by design; this test is about the gate, which must re-run nothing.
    spawn("gate-a", concurrency=2, lease=10.0)
    spawn("gate-b", concurrency=2, lease=10.0)
    run_ids = [start_run("proc-gate", journal=str(journal), n=n) for n in range(20)]
    wait_for(
        lambda: Run.objects.filter(pk__in=run_ids, status="running").count() >= 3,
        20,
        "attempts to be running",
    )
    services.agent_pause(agent="proc-gate", reason="model misbehaves")
    wait_for(
        lambda: not Run.objects.filter(pk__in=run_ids, status="running").exists(),
        15,
        "every running attempt to stop at its boundary",
    )
    held = Attempt.objects.filter(run_id__in=run_ids, error_message="released: paused")
    assert held.exists()
    assert set(held.values_list("status", flat=True)) == {"aborted"}
    # Nothing is claimed while the gate is shut; the workers keep trying meanwhile.
    wait_for(lambda: time.sleep(1.0) or True, 5, "a second of claims")
    gate = AgentGate.objects.get(pk="proc-gate")
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FROM runs_attempt a JOIN runs_run r ON r.id = a.run_id
            WHERE r.agent = %s AND a.started_at >= %s
            """,
            ["proc-gate", gate.paused_at],
        )
        (claimed_while_paused,) = cursor.fetchone()
    assert claimed_while_paused == 0
    unfinished = Run.objects.filter(pk__in=run_ids).exclude(status="succeeded").count()
    assert unfinished > 0
    services.agent_unpause(agent="proc-gate")
    wait_for(
        lambda: Run.objects.filter(pk__in=run_ids, status="succeeded").count() == 20,
        60,
        "all 20 runs to finish",
    )
    steps = Counter((e["run_id"], e["step"]) for e in entries(journal, "step"))
    assert len(steps) == 20 * 4
    twice = [k for k, v in steps.items() if v > 1]
    detail = {
        run_id: list(RunEvent.objects.filter(run_id=run_id).values_list("type", "actor", "payload"))
        for run_id, _ in twice
    }
    assert not twice, detail
