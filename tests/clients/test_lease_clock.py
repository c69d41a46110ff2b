"""A live worker never gives up a lease the server still holds, whatever the load.

Both clients used to date a renewal by when its watch was *sent*, while the server holds a
watch for a third of the lease before it answers: the client's reckoning ran a third of a
lease behind the server's, and it needed two answers in a row within 80 % of the lease
(a round trip of under 0.4 s with a 6 s lease). On a loaded machine (load average 10-12)
workers gave up leases that the server had just renewed. Now the watch answers the
seconds its lease has left (``lease_seconds_left``, on the server's clock), and the
client counts them from when the answer arrived, on its monotonic clock.

- the watch's answer, through the API;
- a scenario in which every answer of the live server reaches the workers 1.2 s late
  (``LateAnswers``): the old reckoning loses every attempt longer than 4.8 s, the new one
  none;
- both clients' workers under a CPU hog: five busy loops per core (10 on 2 cores) for two
  minutes, the machine's CPU taken by them as their own CPU time shows, with zero leases
  lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.db import connection

from bench.common import process_cpu_seconds
from runs import services
from runs.models import Attempt, Run, RunEvent
from tests.api.conftest import post, worker_client
from tests.clients.conftest import LiveServer, wait_for, wait_until_the_server_is_idle
from tests.clients.late_answers import LateAnswers
from tests.clients.node import CLIENT, build
from tests.runs.factory import start

LEASE_SECONDS = 6.0


# --- The watch's answer -----------------------------------------------------------------------


@pytest.mark.django_db
def test_a_watch_answers_the_seconds_its_lease_has_left_on_the_servers_clock() -> None:
    start()
    worker = worker_client("clock")
    claimed = post(worker, "/api/worker/claim", {"worker_id": "clock/1", "lease_seconds": 30})
    assert claimed.status_code == 200, claimed.content
    lease = claimed.json()
    url = f"/api/worker/attempts/{lease['attempt_id']}/watch"

    held = post(worker, url, {"lease_epoch": lease["lease_epoch"], "lease_seconds": 30, "wait": 1})
    assert held.status_code == 200, held.content
    body = held.json()
    # Renewed when the watch answered, not when it was sent: a whole lease is left, not 29 s.
    assert 29.0 < body["lease_seconds_left"] <= 30.0
    # What clients before the field read is still there.
    assert body["cancel_requested"] is False and body["pause_requested"] is False
    assert body["lease_expires_at"]
    attempt = Attempt.objects.get(pk=lease["attempt_id"])
    assert attempt.lease_expires_at is not None

    short = post(worker, url, {"lease_epoch": lease["lease_epoch"], "lease_seconds": 5})
    assert 4.0 < short.json()["lease_seconds_left"] <= 5.0


# --- Workers of both clients, as processes -------------------------------------------------------


@dataclass
class Workers:
    url: str
    token: str
    tmp: Path
    procs: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)

    def start(self, client: str, name: str, *, concurrency: int) -> None:
        if client == "python":
            command = [sys.executable, "-m", "holdpoint_client.cli"]
            target, cwd = "tests.clients.agents:looper", Path(settings.BASE_DIR)
        else:
            build()
            command, target, cwd = ["node", "dist/cli.js"], "./test/agents.mjs:looper", CLIENT
        log = self.tmp / f"{name}.log"
        proc = subprocess.Popen(
            [
                *command,
                "--url",
                self.url,
                "--lease-seconds",
                str(LEASE_SECONDS),
                "--wait",
                "2",
                "--concurrency",
                str(concurrency),
                "--name",
                name,
                target,
            ],
            cwd=cwd,
            env={**os.environ, "HOLDPOINT_TOKEN": self.token, "PYTHONUNBUFFERED": "1"},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.procs.append((proc, log))
        wait_for(
            lambda: "serving" in log.read_text() or proc.poll() is not None, 120, f"{name} to start"
        )
        assert proc.poll() is None, log.read_text()

    def gave_up(self) -> list[str]:
        """Lines in which a worker took a lease as lost or abandoned an attempt."""
        return [
            f"{log.name}: {line}"
            for _, log in self.procs
            for line in log.read_text(errors="replace").splitlines()
            if "lease lost" in line or "abandoned" in line
        ]

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def workers(token: str, tool_dir: Path, tmp_path: Path) -> Iterator[Callable[[str], Workers]]:
    made: list[Workers] = []

    def make(url: str) -> Workers:
        made.append(Workers(url, token, tmp_path))
        return made[-1]

    yield make
    for group in made:
        group.stop()
    wait_until_the_server_is_idle()


class Sweeper(threading.Thread):
    """Expires leases that ran out (the live server runs no sweeper): a lease the workers
    let lapse becomes an ``attempt.lost`` event, which the tests count."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            while not self.halt.wait(0.5):
                services.sweep_all()
        finally:
            connection.close()

    def __enter__(self) -> Sweeper:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(30)


AGENTS = {"python": "remote-loop", "typescript": "ts-loop"}


def start_loop(client: str, operator: Any, *, steps: int, pause: float) -> str:
    return services.run_start(
        agent=AGENTS[client], input={"steps": steps, "pause": pause}, user=operator
    ).id


def assert_no_lease_was_lost(run_ids: list[str], group: Workers) -> None:
    lost = list(
        RunEvent.objects.filter(run_id__in=run_ids, type="attempt.lost").values_list(
            "run_id", "payload"
        )
    )
    assert lost == [], f"leases lost: {lost}"
    assert group.gave_up() == [], "\n".join(group.gave_up()[:20])
    attempts = {run_id: Attempt.objects.filter(run_id=run_id).count() for run_id in run_ids}
    assert set(attempts.values()) == {1}, f"attempts per run: {attempts}"


def wait_all_succeeded(run_ids: list[str], timeout: float) -> None:
    def done() -> bool:
        statuses = set(Run.objects.filter(pk__in=run_ids).values_list("status", flat=True))
        if statuses - {"running", "queued", "succeeded", "waiting"}:
            raise AssertionError(f"a run ended otherwise: {statuses}")
        return statuses == {"succeeded"}

    wait_for(done, timeout, f"{len(run_ids)} runs to succeed")


# --- Every answer late --------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_workers_keep_their_leases_when_every_answer_arrives_late(
    live_api: LiveServer, workers: Callable[[str], Workers], operator: Any
) -> None:
    address = urlsplit(live_api.url)
    with LateAnswers(address.hostname or "127.0.0.1", address.port or 80, delay=1.2) as late:
        group = workers(late.url)
        group.start("python", "py-late", concurrency=2)
        group.start("typescript", "ts-late", concurrency=2)
        with Sweeper():
            run_ids = [
                start_loop(client, operator, steps=5, pause=1.0)
                for client in ("python", "typescript")
                for _ in range(2)
            ]
            # Each run holds its lease for well over 4.8 s (80 % of the lease), the most
            # that dating renewals by their requests could stand with answers this late.
            wait_all_succeeded(run_ids, timeout=240)
        group.stop()
    assert_no_lease_was_lost(run_ids, group)


# --- A CPU hog ----------------------------------------------------------------------------------


def available_cores() -> float:
    """The cores this process may use: its CPU affinity, capped by a cgroup quota (a
    container may see the host's CPUs and be allowed two)."""
    cores = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
    except (OSError, ValueError):
        return cores
    return cores if quota == "max" else min(cores, int(quota) / int(period))


# How long the hogs saturate the machine while the workers run (the load average's minute
# to rise past four times the cores, and a minute above it, as first written).
HOGGED_SECONDS = 120.0


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.process
@pytest.mark.timeout(900)
@pytest.mark.django_db(transaction=True)
def test_workers_keep_their_leases_under_a_cpu_hog(
    live_api: LiveServer, workers: Callable[[str], Workers], operator: Any
) -> None:
    """Five busy loops per core beside the workers for two minutes: the run queue is at
    least four times the cores, checked by the CPU the hogs themselves got (not by the
    load average, which a sandbox may not report)."""
    cores = available_cores()
    group = workers(live_api.url)
    group.start("python", "py-hog-1", concurrency=2)
    group.start("python", "py-hog-2", concurrency=2)
    group.start("typescript", "ts-hog", concurrency=2)
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(max(10, int(5 * cores)))
    ]
    hogged_from = time.monotonic()
    hog_cpu = hogged = 0.0
    run_ids: list[str] = []
    try:
        with Sweeper():
            clients = ["python", "python", "typescript"]
            # Keep six runs going while the hogs run.
            while time.monotonic() - hogged_from < HOGGED_SECONDS:
                going = Run.objects.filter(pk__in=run_ids).exclude(status="succeeded").count()
                for _ in range(6 - going):
                    client = clients[len(run_ids) % len(clients)]
                    run_ids.append(start_loop(client, operator, steps=6, pause=1.5))
                lost = RunEvent.objects.filter(run_id__in=run_ids, type="attempt.lost").count()
                if lost or group.gave_up():
                    break  # It failed already.
                time.sleep(1.0)
            hog_cpu = sum(process_cpu_seconds(hog.pid) for hog in hogs)
            hogged = time.monotonic() - hogged_from
            if not RunEvent.objects.filter(run_id__in=run_ids, type="attempt.lost").exists():
                wait_all_succeeded(run_ids, timeout=300)
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(10)
    group.stop()
    assert_no_lease_was_lost(run_ids, group)
    # The hogs were running, not starved or stopped: together they got most of the machine.
    assert hog_cpu >= 0.6 * cores * hogged, (
        f"{len(hogs)} hogs used {hog_cpu:.0f} CPU s in {hogged:.0f} s on {cores:g} cores: "
        "the machine was not saturated"
    )
    assert len(run_ids) >= 12
