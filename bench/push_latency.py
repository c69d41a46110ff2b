"""Push latency of the live dashboard: commit -> every open run page has the fragment.

100 websocket clients (each its own signed-in viewer, as 100 people) watch one run's page
through a ``daphne`` web process; this process plays the worker: it commits one
``attempt_log`` (one event, one transaction) at a time and times, for every client, the
moment the pushed fragment arrives, from the moment the commit returned. The path is the
production one: on_commit -> Redis channel layer -> each consumer re-reads its session,
user, permission and the run, renders the page's partials -> websocket frame.

Next to it, measured in the same run: the bare channel-layer round trip (``group_send``
to 100 channels in one group, received in another process): the floor under any push.

    DATABASE_URL=postgres://USER@HOST:PORT/NAME REDIS_URL=redis://HOST:PORT/N \\
        python bench/push_latency.py [--sockets 100] [--pushes 30]

It works in its own scratch database ``<NAME>_push`` (created, migrated, dropped) and its
own channel-layer prefix, so it never touches the database in ``DATABASE_URL`` or another
process's pushes. Clocks: ``time.monotonic()`` on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing as mp
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
GROUP = "bench-push-floor"


# --- Set-up --------------------------------------------------------------------------------


def database_urls() -> tuple[str, str]:
    """(the scratch database's URL, the maintenance database's URL)."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit("push_latency needs PostgreSQL: set DATABASE_URL=postgres://USER@HOST:PORT/NAME")
    parts = urlsplit(url)
    name = parts.path.lstrip("/") + "_push"
    scratch = urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, ""))
    admin = urlunsplit((parts.scheme, parts.netloc, "/postgres", parts.query, ""))
    return scratch, admin


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    import psycopg

    url, admin = database_urls()
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {**os.environ, "DATABASE_URL": url, "LOG_LEVEL": "WARNING"}
        subprocess.run(
            [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
        )
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def daphne(env: dict[str, str]) -> Iterator[int]:
    """The web process: daphne serving config.asgi, as the Procfile's ``web``."""
    port = free_port()
    proc = subprocess.Popen(
        [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except urllib.error.HTTPError:
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("daphne did not start") from None
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def viewers_with_sessions(count: int) -> list[str]:
    """``count`` viewers, each signed in once: their session cookies."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.models import Group, User
    from django.contrib.sessions.backends.db import SessionStore

    from runs.groups import ensure_default_groups

    ensure_default_groups()
    viewer = Group.objects.get(name="viewer")
    cookies = []
    for n in range(count):
        user = User(username=f"bench-viewer-{n}")
        user.set_unusable_password()
        user.save()
        user.groups.add(viewer)
        session = SessionStore()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        cookies.append(f"{settings.SESSION_COOKIE_NAME}={session.session_key}")
    return cookies


def a_running_run() -> tuple[str, dict[str, Any]]:
    """A run of an HTTP-worker agent, claimed: (run id, the epochs its worker writes with)."""
    from runs import services
    from runs.models import DeclaredAgent

    DeclaredAgent.objects.update_or_create(
        name="bench-agent", defaults={"description": "push benchmark"}
    )
    run = services.run_start(agent="bench-agent", input={})
    lease = services.attempt_claim(worker_id="bench-worker", lease_seconds=3600)
    assert lease is not None and lease.run_id == run.id
    epochs = {
        "attempt_id": lease.attempt_id,
        "lease_epoch": lease.lease_epoch,
        "cancel_epoch": lease.cancel_epoch,
    }
    return run.id, epochs


# --- Statistics ----------------------------------------------------------------------------


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary(values_ms: list[float]) -> dict[str, float]:
    ordered = sorted(values_ms)
    return {
        "n": len(ordered),
        "p50": percentile(ordered, 50),
        "p95": percentile(ordered, 95),
        "p99": percentile(ordered, 99),
        "max": ordered[-1] if ordered else math.nan,
    }


# --- The floor: the bare channel layer -------------------------------------------------------


def _floor_receivers(
    url: str, prefix: str, count: int, messages: int, ready: Any, out: Any
) -> None:
    from channels_redis.core import RedisChannelLayer

    async def main() -> None:
        layer = RedisChannelLayer(hosts=[url], prefix=prefix)
        channels = [await layer.new_channel() for _ in range(count)]
        for channel in channels:
            await layer.group_add(GROUP, channel)
        latencies: list[float] = []

        async def listen(channel: str) -> None:
            for _ in range(messages):
                message = await layer.receive(channel)
                latencies.append(time.monotonic() - message["sent"])

        tasks = [asyncio.create_task(listen(c)) for c in channels]
        ready.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
        for channel in channels:
            await layer.group_discard(GROUP, channel)
        out.put(latencies)

    asyncio.run(main())


def bare_round_trip(url: str, prefix: str, count: int, messages: int) -> list[float]:
    from channels_redis.core import RedisChannelLayer

    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(
        target=_floor_receivers, args=(url, prefix, count, messages, ready, out), daemon=True
    )
    proc.start()
    if not ready.wait(60):
        raise RuntimeError("the floor's receivers did not start")
    time.sleep(0.2)

    async def send() -> None:
        layer = RedisChannelLayer(hosts=[url], prefix=prefix)
        for seq in range(messages):
            await layer.group_send(
                GROUP, {"type": "bench.push", "seq": seq, "sent": time.monotonic()}
            )
            await asyncio.sleep(0.1)

    asyncio.run(send())
    latencies: list[float] = out.get(timeout=300)
    proc.join(30)
    return latencies


# --- The full path ---------------------------------------------------------------------------


async def full_path(
    port: int, run_id: str, epochs: dict[str, Any], cookies: list[str], pushes: int
) -> tuple[list[float], int]:
    """(latencies in seconds, frames that were not the expected push)."""
    import websockets
    from asgiref.sync import sync_to_async

    from runs import services
    from runs.models import Run

    seq = await sync_to_async(lambda: Run.objects.get(pk=run_id).last_event_seq)()
    url = f"ws://127.0.0.1:{port}/ws/runs/{run_id}/?v={seq}"
    origin = f"http://127.0.0.1:{port}"
    clients = [
        await websockets.connect(
            url, additional_headers=[("Origin", origin), ("Cookie", cookie)], max_size=None
        )
        for cookie in cookies
    ]
    # Each socket's first frame: the snapshot (here, the nav badge: the page is current).
    await asyncio.gather(*(c.recv() for c in clients))

    latencies: list[float] = []
    stray = 0
    marker = f'id="run-{run_id}-timeline"'

    async def first_push(client: Any, committed: asyncio.Future[float]) -> None:
        nonlocal stray
        while True:
            frame = await client.recv()
            arrived = time.monotonic()
            if marker in frame:
                latencies.append(arrived - await committed)
                return
            stray += 1

    def commit(n: int) -> float:
        services.attempt_log(**epochs, message=f"bench line {n}")
        return time.monotonic()  # the commit has returned; the push is on its way

    for n in range(pushes):
        loop = asyncio.get_running_loop()
        committed: asyncio.Future[float] = loop.create_future()
        waiting = [asyncio.create_task(first_push(c, committed)) for c in clients]
        committed.set_result(await sync_to_async(commit, thread_sensitive=False)(n))
        await asyncio.wait_for(asyncio.gather(*waiting), timeout=60)
        await asyncio.sleep(0.2)  # let the web process go idle between pushes
    for client in clients:
        await client.close()
    return latencies, stray


# --- Main ------------------------------------------------------------------------------------


def row(label: str, s: dict[str, float]) -> str:
    return (
        f"  {label:<58} {s['n']:>6} {s['p50']:>8.1f} {s['p95']:>8.1f} {s['p99']:>8.1f}"
        f" {s['max']:>8.1f}"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sockets", type=int, default=100)
    parser.add_argument("--pushes", type=int, default=30)
    opts = parser.parse_args(argv)
    redis_url = os.environ.get("REDIS_URL", "")
    if not redis_url.startswith(("redis://", "rediss://", "unix://")):
        sys.exit("push_latency needs Redis: set REDIS_URL=redis://127.0.0.1:6379/N")
    prefix = f"holdpoint-bench-{os.getpid()}"

    floor = summary(
        [s * 1000 for s in bare_round_trip(redis_url, prefix + "-floor", opts.sockets, opts.pushes)]
    )

    with scratch_database() as db_url:
        env = {
            "DATABASE_URL": db_url,
            "REDIS_URL": redis_url,
            "CHANNEL_PREFIX": prefix,
            "LOG_LEVEL": "WARNING",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
        }
        os.environ.update(env)
        setup_django()
        cookies = viewers_with_sessions(opts.sockets)
        run_id, epochs = a_running_run()
        with daphne(env) as port:
            latencies, stray = asyncio.run(full_path(port, run_id, epochs, cookies, opts.pushes))
        from django.db import connections

        connections.close_all()
    full = summary([s * 1000 for s in latencies])

    print()
    print(
        f"Push latency, {opts.sockets} websocket clients on one run page, Redis channel layer "
        f"({platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs)"
    )
    print(f"  {'path':<58} {'n':>6} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}  (ms)")
    print(row(f"bare channel layer: group_send -> {opts.sockets} receivers", floor))
    print(row(f"commit -> {opts.sockets} websocket clients have the fragment", full))
    if stray:
        print(f"  ({stray} other frames arrived: nav badges, not counted)")
    ratio = full["p50"] / floor["p50"] if floor["p50"] else math.nan
    print(f"  full path p50 is {ratio:.1f}x the bare channel layer's")
    return {"sockets": opts.sockets, "bare_channel_layer_ms": floor, "full_path_ms": full}


if __name__ == "__main__":
    main()
