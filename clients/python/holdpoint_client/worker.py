"""A pool of worker threads serving agents over the worker protocol.

Each thread long-polls ``POST /api/worker/claim`` (the server holds the request until
work is due, woken by the same NOTIFY as its in-process workers), runs the attempt it
gets, and claims again. The agents are declared first (``PUT /api/agents/{name}``).
When the server is away or fails (a connection error, a 5xx), every call backs off
(0.1 s doubling to 5 s, with jitter: ``http.backoff``) and tries again; a 4xx is never
tried again (a refused declaration is ``DeclarationRefused``).

``stop()``: every attempt finishes its current step, ``ctx.sleep`` included, and releases
its lease at the step boundary (``shutdown``: another worker goes on from the
checkpoint); after ``grace`` seconds the leases still held are released at once and their
steps abandoned (a ``ctx.sleep`` wakes, the next ``ctx`` call unwinds, and their writes are
refused from then on).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from holdpoint_client.agent import Agent
from holdpoint_client.executor import Outcome
from holdpoint_client.http import Api, Problem, ServerAway, backoff, identity_headers
from holdpoint_client.remote import HeartbeatPool, execute
from holdpoint_client.remote import RemoteControl as AttemptControl

logger = logging.getLogger("holdpoint_client")


class DeclarationRefused(Exception):
    """The server refused to declare an agent (a 4xx: not retried). ``problem`` says why."""

    def __init__(self, agent: str, problem: Problem) -> None:
        super().__init__(f"declaring agent {agent!r} was refused: {problem}")
        self.agent = agent
        self.problem = problem


def default_worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def client_name() -> str:
    """``holdpoint-client-python/<version>``: what the Workers page shows as the client."""
    try:
        version = importlib.metadata.version("holdpoint-client")
    except importlib.metadata.PackageNotFoundError:
        version = "0"
    return f"holdpoint-client-python/{version}"


class Worker:
    def __init__(
        self,
        url: str,
        token: str,
        agents: Iterable[Agent],
        *,
        concurrency: int = 1,
        name: str | None = None,
        lease_seconds: float | None = None,
        wait: float = 20.0,
        declare: bool = True,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.agents = {agent.name: agent for agent in agents}
        if not self.agents:
            raise ValueError("a worker needs at least one agent")
        self.shutdown = threading.Event()
        self.concurrency = concurrency
        self.name = name or default_worker_name()
        identity = identity_headers(
            name=self.name,
            client=client_name(),
            host=socket.gethostname(),
            pid=os.getpid(),
            concurrency=concurrency,
            agents=sorted(self.agents),
            lease_seconds=lease_seconds,
            wait=wait,
        )
        self.api = Api(
            url, token, stop=self.shutdown, timeout=max(30.0, wait + 15.0), headers=identity
        )
        self.lease_seconds = lease_seconds
        self.wait = wait
        self.declare = declare
        self.outcomes: list[tuple[str, Outcome]] = []
        self._active: dict[str, AttemptControl] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.ready = threading.Event()
        # One renewal per interval for all the attempts of this process's threads.
        self.heartbeats = HeartbeatPool(self.api, self.shutdown)

    # Life cycle ----------------------------------------------------------------------

    def start(self) -> Worker:
        if self.declare:
            self._declare_all()
        for index in range(1, self.concurrency + 1):
            thread = threading.Thread(
                target=self._work_loop, args=(index,), name=f"hp-worker-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        self.ready.set()
        logger.info(
            "holdpoint-worker %s: %d threads for %s at %s",
            self.name,
            self.concurrency,
            ", ".join(self.agents),
            self.api.url,
        )
        return self

    def _declare_all(self) -> None:
        """Declare every agent, for as long as it takes while the server is away or fails
        (two workers starting together may meet a 5xx); raise ``DeclarationRefused`` on a
        4xx, which no retry would change."""
        for agent in self.agents.values():
            tries = 0
            while not self.shutdown.is_set():
                try:
                    _, data = self.api.call(
                        "PUT", f"/api/agents/{agent.name}", agent.declaration(), retry_for=30.0
                    )
                    logger.info("declared agent %s (version %s)", agent.name, data["version"])
                    break
                except Problem as exc:
                    raise DeclarationRefused(agent.name, exc) from exc
                except ServerAway as exc:
                    tries += 1
                    delay = backoff(tries)
                    logger.warning("declaring %s: %s; again in %.1fs", agent.name, exc, delay)
                    self.shutdown.wait(delay)

    def run_forever(self) -> None:
        while not self.shutdown.wait(0.5):
            pass

    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def stop(self, grace: float = 10.0) -> None:
        self.shutdown.set()
        deadline = time.monotonic() + grace
        # Steps are not woken: a step, and its ctx.sleep, finish within the grace; the
        # executor releases the lease at the boundary. Past the grace, _release_all marks
        # them stale, which wakes a sleep and unwinds the step at its next ctx call.
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._release_all()
        self.heartbeats.stop()
        self.api.close()

    def _release_all(self) -> None:
        with self._lock:
            controls = list(self._active.values())
        for control in controls:
            control.mark_stale("worker stopping before the step finished")
            control.finishing.set()
            if control.release("shutdown") is not None:
                logger.info("attempt %s released at shutdown", control.attempt_id)

    def active_attempts(self) -> list[str]:
        with self._lock:
            return list(self._active)

    # Threads -------------------------------------------------------------------------

    def _claim(self, worker_id: str) -> dict[str, Any] | None:
        body: dict[str, Any] = {
            "worker_id": worker_id,
            "agents": sorted(self.agents),
            "wait": self.wait,
        }
        if self.lease_seconds:
            body["lease_seconds"] = self.lease_seconds
        status, data = self.api.call("POST", "/api/worker/claim", body, retry_for=0)
        return data if status == 200 else None

    def _work_loop(self, index: int) -> None:
        worker_id = f"{self.name}/{index}"
        tries = 0
        while not self.shutdown.is_set():
            try:
                lease = self._claim(worker_id)
            except ServerAway as exc:
                tries += 1
                delay = backoff(tries)
                logger.warning("%s: claim: %s; again in %.1fs", worker_id, exc, delay)
                self.shutdown.wait(delay)
                continue
            except Problem as exc:
                # Not a retry of the same request: a new claim, after a pause, in case
                # what was refused changes (a token scoped anew, an agent declared).
                tries += 1
                logger.error("%s: claim refused: %s", worker_id, exc)
                self.shutdown.wait(max(backoff(tries), 1.0))
                continue
            tries = 0
            if lease is None:
                continue
            agent = self.agents[lease["agent"]]
            control = AttemptControl(self.api, lease, self.shutdown)
            with self._lock:
                self._active[lease["attempt_id"]] = control
            try:
                outcome = execute(
                    self.api,
                    agent,
                    lease,
                    shutdown=self.shutdown,
                    control=control,
                    heartbeats=self.heartbeats,
                )
                self.outcomes.append((lease["attempt_id"], outcome))
            except Exception:
                logger.exception("%s: attempt %s crashed", worker_id, lease["attempt_id"])
            finally:
                with self._lock:
                    self._active.pop(lease["attempt_id"], None)
