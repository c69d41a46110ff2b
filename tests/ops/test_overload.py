"""Graceful overload of the web process (docs/operations.md, Overload).

The Procfile's ``web`` line, started as the Procfile starts it (uvicorn, one worker here),
against the test database, over real HTTP, driven well past what it may serve:

- a small admission limit (``HOLDPOINT_WEB_MAX_INFLIGHT=2``) and many workers writing
  at once through ``holdpoint_client``'s ``Api`` (which sends a refused or dropped call
  again with the same ``Idempotency-Key``): no answer is a 5xx other than 503, every 503 is
  ``overloaded`` with ``Retry-After``, no connection is reset, and once the storm is over
  every write is recorded exactly once and every live worker still holds its lease;
- a pool of one database connection that times out at once: a request that gets no
  connection is a 503 ``overloaded`` with ``Retry-After``, not a 500.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from django.db import connection
from holdpoint_client.http import Api

from api.problems import pool_exhausted
from bench.body_limit import procfile_line
from bench.common import declare_bench_agent, free_port
from runs import services
from runs.models import Attempt, Checkpoint
from runs.tokens import worker_token_create
from tests.waiting import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@contextlib.contextmanager
def procfile_web(tmp_path: Path, **env: str) -> Iterator[str]:
    """The Procfile's web line, one worker process, on a free port; yields its base URL."""
    port = free_port()
    log = tmp_path / f"web-{port}.log"
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {procfile_line('web')}"],
        cwd=ROOT,
        env={
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
            "DATABASE_URL": database_url(),
            "HOLDPOINT_AGENT_MODULES": "",
            "LOG_LEVEL": "WARNING",
            "HOST": "127.0.0.1",
            "PORT": str(port),
            "WEB_CONCURRENCY": "1",
            **env,
        },
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, f"the web process exited: {log.read_text()[-3000:]}"
        try:
            return httpx.get(base + "/healthz", timeout=2).status_code < 500
        except httpx.TransportError:
            return False

    try:
        wait_for(up, 60, "the Procfile's web process", interval=0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Recorder(httpx.HTTPTransport):
    """httpx's own transport, noting every answer and every dropped connection on the way
    (the client under test sees exactly what it would see without it)."""

    def __init__(self, seen: list[tuple[int, str, str, str]], errors: list[str]) -> None:
        super().__init__()
        self.seen = seen
        self.errors = errors

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = super().handle_request(request)
        except httpx.TransportError as exc:
            self.errors.append(f"{request.url.path}: {type(exc).__name__}: {exc}")
            raise
        response.read()
        code = ""
        if response.headers.get("content-type", "").startswith("application/problem+json"):
            code = str(response.json().get("code", ""))
        self.seen.append(
            (response.status_code, code, response.headers.get("retry-after", ""), request.url.path)
        )
        return response


WORKERS = 16
CHECKPOINTS = 12
LEASE_SECONDS = 30.0  # a heartbeat a second must get through within it, at load 8 too
HEARTBEAT_EVERY = 1.0


def test_past_its_admission_limit_the_web_process_refuses_with_503_and_loses_nothing(
    tmp_path: Path,
) -> None:
    agent = declare_bench_agent("overload")
    _, token = worker_token_create(name="overload")
    for i in range(WORKERS):
        services.run_start(agent=agent, input={"i": i})
    seen: list[tuple[int, str, str, str]] = []
    dropped: list[str] = []
    with procfile_web(tmp_path, HOLDPOINT_WEB_MAX_INFLIGHT="2", DATABASE_POOL_SIZE="4") as base:
        leases = []
        claimer = Api(base, token, transport=Recorder(seen, dropped))
        for n in range(WORKERS):
            _, lease = claimer.call(
                "POST",
                "/api/worker/claim",
                {"worker_id": f"w{n}", "agents": [agent], "lease_seconds": LEASE_SECONDS},
                retry_for=120,
            )
            leases.append(lease)
        claimer.close()

        start = threading.Barrier(WORKERS)
        written: dict[int, list[str]] = {}
        lost: list[str] = []
        failures: list[str] = []

        def worker(n: int) -> None:
            lease = leases[n]
            url = f"/api/worker/attempts/{lease['attempt_id']}"
            epochs = {"lease_epoch": lease["lease_epoch"], "cancel_epoch": lease["cancel_epoch"]}
            api = Api(base, token, transport=Recorder(seen, dropped))
            done = threading.Event()

            def beat() -> None:
                # The lease is renewed beside the writes, as the client's heartbeat does.
                while not done.wait(HEARTBEAT_EVERY):
                    try:
                        api.call("POST", f"{url}/heartbeat", {"lease_epoch": epochs["lease_epoch"]})
                    except Exception as exc:  # a lost lease is a Problem: the test fails
                        lost.append(f"worker {n}: {exc}")
                        return

            beating = threading.Thread(target=beat, daemon=True)
            beating.start()
            start.wait(timeout=60)
            written[n] = []
            try:
                for step in range(CHECKPOINTS):
                    mark = f"w{n}-s{step}"
                    status, body = api.call(
                        "POST",
                        f"{url}/checkpoint",
                        {**epochs, "step": "work", "state": {"mark": mark}},
                        retry_for=120,
                    )
                    assert status == 201, body
                    written[n].append(mark)
            except Exception as exc:
                failures.append(f"worker {n}: {exc!r}")
            finally:
                done.set()
                beating.join(timeout=30)
                api.close()

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=240)
        assert not any(t.is_alive() for t in threads), "a worker did not finish within 240 s"

        statuses = Counter(status for status, *_ in seen)
        # The web process was driven past its limit: it refused some of the work.
        assert statuses[503] > 0, statuses
        # No 5xx but 503, and every 503 says why and when to come back.
        assert all(status < 500 or status == 503 for status in statuses), statuses
        refusals = [s for s in seen if s[0] == 503]
        assert {code for _, code, _, _ in refusals} == {"overloaded"}, refusals[:5]
        assert all(after.isdigit() and int(after) >= 1 for _, _, after, _ in refusals)
        # No connection was reset or closed under a request.
        assert dropped == []
        # Every keyed call finished, and no live worker lost its lease.
        assert failures == []
        assert lost == []
        assert all(len(written[n]) == CHECKPOINTS for n in range(WORKERS))

    # Each intended write recorded exactly once (a refused try changed nothing).
    marks = Counter(
        state["mark"]
        for state in Checkpoint.objects.filter(state__has_key="mark").values_list(
            "state", flat=True
        )
    )
    assert len(marks) == WORKERS * CHECKPOINTS
    assert set(marks.values()) == {1}
    # Each attempt still runs under the lease its worker was given.
    for lease in leases:
        attempt = Attempt.objects.get(pk=lease["attempt_id"])
        assert attempt.lease_epoch == lease["lease_epoch"]
        assert attempt.status == "running", attempt.status


def test_a_request_that_gets_no_pooled_connection_is_a_503_overloaded(tmp_path: Path) -> None:
    import psycopg

    row, token = worker_token_create(name="pool")
    agent = declare_bench_agent()
    run = services.run_start(agent=agent, input={})
    lease = services.attempt_claim(
        worker_id="held", agents=[agent], worker_token_id=row.pk, lease_seconds=600
    )
    assert lease is not None and lease.run_id == run.id
    answers: list[tuple[int, str, str]] = []
    dropped: list[str] = []
    held: list[int] = []
    # One pooled connection, given up on after 0.1 s; the admission limit off, so that
    # every request reaches the pool.
    with (
        procfile_web(
            tmp_path,
            DATABASE_POOL_SIZE="1",
            DATABASE_POOL_TIMEOUT="0.1",
            HOLDPOINT_WEB_MAX_INFLIGHT="0",
        ) as base,
        psycopg.connect(database_url()) as holder,
    ):
        # The only pooled connection is taken by a heartbeat that waits for the run's row,
        # which this transaction holds: every other request waits for the pool.
        holder.execute("SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE", [run.id])

        def heartbeat_of_the_held_run() -> None:
            response = httpx.post(
                f"{base}/api/worker/attempts/{lease.attempt_id}/heartbeat",
                json={"lease_epoch": lease.lease_epoch},
                headers={"Authorization": f"Bearer {token}"},
                timeout=120,
            )
            held.append(response.status_code)

        blocked = threading.Thread(target=heartbeat_of_the_held_run)
        blocked.start()

        def waits_for_the_row() -> bool:
            with psycopg.connect(database_url(), autocommit=True) as look:
                row = look.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                ).fetchone()
            return bool(row and row[0])

        wait_for(waits_for_the_row, 60, "the heartbeat to wait for the run's row")
        go = threading.Barrier(24)

        def ask() -> None:
            with httpx.Client(base_url=base, timeout=60) as client:
                go.wait(timeout=60)
                for _ in range(4):
                    try:
                        # A heartbeat of no attempt: the token and the attempt are read
                        # (a pooled connection each time), nothing is written (a 404).
                        response = client.post(
                            "/api/worker/attempts/att_none/heartbeat",
                            json={"lease_epoch": 1},
                            headers={"Authorization": f"Bearer {token}"},
                        )
                    except httpx.TransportError as exc:
                        dropped.append(repr(exc))
                        continue
                    code = ""
                    if response.status_code >= 400:
                        code = str(response.json().get("code", ""))
                    answers.append(
                        (response.status_code, code, response.headers.get("retry-after", ""))
                    )

        threads = [threading.Thread(target=ask) for _ in range(24)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        holder.rollback()  # the row is free: the held heartbeat goes on
        blocked.join(timeout=120)
    assert held == [200]
    statuses = Counter(status for status, _, _ in answers)
    assert dropped == []
    assert statuses[500] == 0, statuses
    refused = [a for a in answers if a[0] == 503]
    assert refused, f"no request waited past the pool's timeout: {statuses}"
    assert all(code == "overloaded" and after.isdigit() for _, code, after in refused), refused[:3]


def test_pool_exhausted_knows_psycopgs_pool_timeout_through_djangos_wrapping() -> None:
    from django.db import OperationalError
    from psycopg_pool import ConnectionPool, PoolTimeout

    wrapped: BaseException | None = None
    with (
        ConnectionPool(database_url(), min_size=1, max_size=1, open=True) as pool,
        pool.connection(),
    ):
        try:
            pool.getconn(timeout=0.1)
        except PoolTimeout as exc:
            # As django.db.utils.DatabaseErrorWrapper wraps it.
            try:
                raise OperationalError(str(exc)) from exc
            except OperationalError as django_error:
                wrapped = django_error
    assert wrapped is not None, "the pool of one busy connection gave a second one"
    assert pool_exhausted(wrapped)
    assert not pool_exhausted(OperationalError("connection refused"))
    assert not pool_exhausted(ValueError("x"))


def test_heartbeats_pass_a_full_admission_limit_that_refuses_other_work(tmp_path: Path) -> None:
    """One request held in flight (its body trickles in) fills a limit of 1: a checkpoint
    is refused at once, on the same keep-alive connection that then carries a heartbeat,
    which is admitted (heartbeats may go past the limit); the limit frees with the request."""
    checkpoint = "/api/worker/attempts/att_none/checkpoint"
    heartbeat = "/api/worker/attempts/att_none/heartbeat"
    with (
        procfile_web(tmp_path, HOLDPOINT_WEB_MAX_INFLIGHT="1") as base,
        httpx.Client(base_url=base, timeout=30) as client,
    ):
        address = ("127.0.0.1", int(base.rsplit(":", 1)[1]))
        held = socket.create_connection(address, timeout=30)
        try:
            held.sendall(
                f"POST {checkpoint} HTTP/1.1\r\nHost: {address[0]}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
            )

            def refused() -> httpx.Response | None:
                response = client.post(checkpoint, json={"lease_epoch": 1})
                return response if response.status_code == 503 else None

            answer = wait_for(refused, 30, "a checkpoint refused past the limit")
            assert answer.headers["content-type"] == "application/problem+json"
            assert answer.json()["code"] == "overloaded"
            assert answer.json()["limit"] == 1
            assert answer.headers["retry-after"].isdigit()
            beat = client.post(heartbeat, json={"lease_epoch": 1})
            assert beat.status_code != 503, beat.text
            assert beat.status_code < 500
        finally:
            held.close()

        def admitted() -> bool:
            return client.post(checkpoint, json={"lease_epoch": 1}).status_code != 503

        wait_for(admitted, 30, "the limit freed when the held request went")
