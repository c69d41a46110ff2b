"""The peer: procrastinate (a PostgreSQL job queue) running a trivial task on the same server.

Procrastinate keeps its tables (``procrastinate_*``) in the benchmark's own scratch
database. Durability is the same as ours: every defer, fetch and finish is its own
committed transaction under the server's ``synchronous_commit``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

QUEUE = "bench"


def make_app(url: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="bench_noop", queue=QUEUE)
    def bench_noop(i: int = 0) -> None:
        """The trivial task; it reports its start for the wake-up figure when asked to."""
        if ON_START is not None:
            ON_START(i)

    return app


# Set in a worker process to learn when each task starts (bench.wakeup).
ON_START: Callable[[int], None] | None = None


def apply_schema(url: str) -> None:
    app = make_app(url)
    with app.open():
        app.schema_manager.apply_schema()


def defer(url: str, count: int) -> float:
    """Defer ``count`` jobs one transaction each; return the seconds it took."""
    app = make_app(url)
    with app.open():
        task = app.tasks["bench_noop"]
        t0 = time.monotonic()
        for i in range(count):
            task.defer(i=i)
        return time.monotonic() - t0


def timed_fetches(app: Any, record: Any) -> None:
    """Wrap the job manager's fetch so that each successful fetch records its latency."""
    manager = app.job_manager
    original = manager.fetch_job

    async def fetch_job(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        job = await original(*args, **kwargs)
        if job is not None:
            record(time.perf_counter() - t0, "fetched")
        return job

    manager.fetch_job = fetch_job
