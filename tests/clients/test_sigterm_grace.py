"""SIGTERM and ``--grace`` with real ``holdpoint-worker`` processes of both clients, against a
live server: a step that sleeps (``ctx.sleep``) when the signal comes.

Within the grace, the sleep lasts its time, the step finishes and checkpoints, and the
worker releases the lease at the boundary and exits (the Python client used to cut the
sleep short at the signal and go on as if it had slept). Past the grace, the worker
releases the lease at once and exits; the step is abandoned where it was, nothing of it is
written, and the next worker runs it again from its start (docs/agents.md, docs/protocol.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from runs import services
from runs.models import Checkpoint, Run, RunEvent
from tests.clients.conftest import (
    LiveServer,
    wait_for,
    wait_status,
    wait_until_the_server_is_idle,
)
from tests.clients.node import CLIENT, build

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]

CLIENTS = ["python", "typescript"]
AGENT = {"python": "remote-nap", "typescript": "ts-nap"}


def naps(tool_dir: Path) -> list[str]:
    log = tool_dir / "naps.log"
    return log.read_text().splitlines() if log.exists() else []


Spawn = Callable[..., "tuple[subprocess.Popen[bytes], Path]"]


@pytest.fixture
def napping_worker(
    live_api: LiveServer, token: str, tool_dir: Path, tmp_path: Path
) -> Iterator[Spawn]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(client: str, name: str, *, grace: float) -> tuple[subprocess.Popen[bytes], Path]:
        if client == "python":
            command = [sys.executable, "-m", "holdpoint_client.cli"]
            target, cwd = "tests.clients.nap_agents:napper", Path(settings.BASE_DIR)
        else:
            build()
            command, target, cwd = ["node", "dist/cli.js"], "./test/agents.mjs:napper", CLIENT
        log = tmp_path / f"{name}.log"
        proc = subprocess.Popen(
            [
                *command,
                "--url",
                live_api.url,
                "--lease-seconds",
                "3",
                "--wait",
                "2",
                "--grace",
                str(grace),
                "--name",
                name,
                target,
            ],
            cwd=cwd,
            env={**os.environ, "HOLDPOINT_TOKEN": token, "PYTHONUNBUFFERED": "1"},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        wait_for(
            lambda: "serving" in log.read_text() or proc.poll() is not None, 60, f"{name} to start"
        )
        assert proc.poll() is None, log.read_text()
        return proc, log

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    wait_until_the_server_is_idle()


def terminate_during_the_nap(
    proc: subprocess.Popen[bytes], log: Path, tool_dir: Path, *, after: float
) -> tuple[float, float]:
    """SIGTERM ``after`` seconds into the first nap; the wall time it was sent and how long
    the process took to exit."""
    wait_for(lambda: "start 1" in naps(tool_dir), 60, "the nap to begin")
    time.sleep(after)
    sent = time.time()
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(90)
    took = time.monotonic() - began
    assert code == 0, log.read_text()
    return sent, took


@pytest.mark.parametrize("client", CLIENTS)
def test_sigterm_lets_a_sleeping_step_finish_within_the_grace_then_releases(
    client: str, napping_worker: Spawn, tool_dir: Path, operator: Any
) -> None:
    proc, log = napping_worker(client, f"{client}-grace", grace=20)
    run_id = services.run_start(agent=AGENT[client], input={"seconds": 6}, user=operator).id
    sent, _ = terminate_during_the_nap(proc, log, tool_dir, after=1.0)

    [end] = [line for line in naps(tool_dir) if line.startswith("end 1 ")]
    slept, ended = float(end.split()[2]), float(end.split()[3])
    assert ended > sent, "the signal came before the sleep was over"
    assert slept >= 5.9, f"the sleep was cut short at the signal: {slept:.3f}s ({log.read_text()})"
    # The step finished and checkpointed; then the worker released the lease at the boundary.
    wake = Checkpoint.objects.get(run_id=run_id, step="wake")
    assert wake.state["slept"] >= 5.9
    released = RunEvent.objects.get(run_id=run_id, type="attempt.released")
    assert released.payload["reason"] == "shutdown"
    assert (
        RunEvent.objects.get(run_id=run_id, type="checkpoint.saved", payload__step="wake").seq
        < released.seq
    )
    run = Run.objects.get(pk=run_id)
    assert run.status == "queued" and run.latest_checkpoint_id == wake.id

    # The next worker goes on from that checkpoint: the nap is not taken again.
    napping_worker(client, f"{client}-next", grace=1)
    wait_status(run_id, "succeeded", timeout=60)
    assert Run.objects.get(pk=run_id).result["slept"] >= 5.9
    assert [line for line in naps(tool_dir) if line.startswith("start")] == ["start 1"]


@pytest.mark.parametrize("client", CLIENTS)
def test_past_the_grace_the_worker_releases_at_once_and_the_step_runs_again(
    client: str, napping_worker: Spawn, tool_dir: Path, operator: Any
) -> None:
    proc, log = napping_worker(client, f"{client}-short-grace", grace=1)
    run_id = services.run_start(
        agent=AGENT[client], input={"seconds": 30, "again": 0.5}, user=operator
    ).id
    _, took = terminate_during_the_nap(proc, log, tool_dir, after=1.0)

    # It did not wait for the 30 s nap: the grace (1 s) was over, the lease released, exit.
    assert took < 20, f"the worker waited {took:.1f}s for a step past its grace of 1s"
    assert not [line for line in naps(tool_dir) if line.startswith("end 1")]
    assert not Checkpoint.objects.filter(run_id=run_id, step="wake").exists()
    released = RunEvent.objects.get(run_id=run_id, type="attempt.released")
    assert released.payload["reason"] == "shutdown"
    run = Run.objects.get(pk=run_id)
    assert run.status == "queued"
    assert Checkpoint.objects.get(pk=run.latest_checkpoint_id).step == "nap"

    # The next worker runs the step again from its start.
    napping_worker(client, f"{client}-again", grace=1)
    wait_status(run_id, "succeeded", timeout=60)
    assert [line.split()[:2] for line in naps(tool_dir)] == [
        ["start", "1"],
        ["start", "2"],
        ["end", "2"],
    ]
