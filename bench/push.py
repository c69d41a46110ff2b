"""Push latency of the live dashboard: commit -> 100 open run pages have the fragment.

Full path. ``--subscribers`` websocket clients (each its own signed-in user, the roles
taken in turn from ``--roles``) watch one run's page through one ``daphne`` web
process, as the Procfile's ``web`` runs it. This process plays the worker: it commits
one service call at a time and, for every client, times the moment the pushed fragment
arrives from the moment the commit returned. The path is the production one:
``on_commit`` -> Redis channel layer -> the process's live hub re-reads sessions, users,
permissions and the run, renders the page's partials -> one websocket frame per page.
The commits go round a worker's cycle: a log line (only the parts every user sees alike
change), then a checkpoint, a question asked, answered and the run claimed again (the
user's controls and the question's card change too, and depend on the role).

Baseline in the same run: the bare channel-layer round trip, ``group_send`` to as many
channels in one group, received in another process: the floor under any push. The
clients of both live in a process of their own, so receiving costs the same on both
sides. Target: full path p99 < 50 ms.

    python -m bench.push [--subscribers 100] [--messages 30] [--roles viewer,operator,approver]
                         [--profile FILE]

``--profile`` samples the daphne process with py-spy during the full path, writes the
collapsed stacks to FILE and prints where the live hub's render thread spent its time.

It works in its own scratch database ``<NAME>_push`` and its own channel-layer prefix, so
it never touches the database in ``DATABASE_URL`` or another process's pushes. Clocks:
``time.monotonic()`` (one clock for every process on the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import multiprocessing as mp
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import (
    PYTHON,
    SERVERS,
    Summary,
    declare_bench_agent,
    save_result,
    scratch_database,
    setup_django,
    table,
    verdict,
    web_server,
)

GROUP = "bench-push-floor"
TARGET_P99_MS = 50.0
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"version": {"type": "string"}},
    "required": ["version"],
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
    """Seconds from ``group_send`` to each receiver having the message."""
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
            await asyncio.sleep(0.2)  # the same pace as the full path's commits

    asyncio.run(send())
    latencies: list[float] = out.get(timeout=300)
    proc.join(30)
    return latencies


# --- The full path: the websocket clients ----------------------------------------------------


def _websocket_clients(
    url: str, origin: str, cookies: list[str], marker: str, pushes: int, ready: Any, out: Any
) -> None:
    """One process holding every client: after each push, report when each one had it."""
    import websockets

    async def main() -> None:
        clients = [
            await websockets.connect(
                url, additional_headers=[("Origin", origin), ("Cookie", c)], max_size=None
            )
            for c in cookies
        ]
        # Each socket's first frame: the snapshot (the nav badge: the page is current).
        await asyncio.gather(*(c.recv() for c in clients))
        ready.set()
        for n in range(pushes):
            stray = 0

            async def first_push(client: Any) -> float:
                nonlocal stray
                while True:
                    frame = await client.recv()
                    arrived = time.monotonic()
                    if marker in frame:
                        return arrived
                    stray += 1

            arrivals = await asyncio.wait_for(
                asyncio.gather(*(first_push(c) for c in clients)), timeout=60
            )
            out.put((n, list(arrivals), stray))
        for client in clients:
            await client.close()

    try:
        asyncio.run(main())
    except Exception as exc:  # the committing side waits for a report: send one
        out.put((-1, [], repr(exc)))
        raise


def people_with_sessions(count: int, roles: list[str]) -> tuple[list[str], Any]:
    """``count`` people, each signed in once, taking ``roles`` in turn: (their session
    cookies, an operator to answer the questions with)."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.models import Group, User
    from django.contrib.sessions.backends.db import SessionStore
    from django.middleware.csrf import _get_new_csrf_string

    from runs.groups import ensure_default_groups

    ensure_default_groups()
    groups = {name: Group.objects.get(name=name) for name in set(roles)}
    cookies = []
    for n in range(count):
        user = User(username=f"bench-{roles[n % len(roles)]}-{n}")
        user.set_unusable_password()
        user.save()
        user.groups.add(groups[roles[n % len(roles)]])
        session = SessionStore()
        session[SESSION_KEY] = str(user.pk)
        session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        # A browser on the page has the CSRF cookie the page set, as well as its session.
        cookies.append(
            f"{settings.SESSION_COOKIE_NAME}={session.session_key}; "
            f"{settings.CSRF_COOKIE_NAME}={_get_new_csrf_string()}"
        )
    answerer = User.objects.create(username="bench-answerer")
    answerer.groups.add(Group.objects.get(name="operator"))
    return cookies, answerer


class Worker:
    """Plays the run's worker: each step is one service call, one commit, one push."""

    def __init__(self, answerer: Any) -> None:
        from runs import services

        self.services = services
        self.answerer = answerer
        agent = declare_bench_agent()
        self.run_id = services.run_start(agent=agent, input={}).id
        self.claim()
        self.checkpoint_id = ""
        self.request_id = ""

    def claim(self) -> None:
        lease = self.services.attempt_claim(worker_id="bench-worker", lease_seconds=3600)
        assert lease is not None and lease.run_id == self.run_id
        self.epochs = {
            "attempt_id": lease.attempt_id,
            "lease_epoch": lease.lease_epoch,
            "cancel_epoch": lease.cancel_epoch,
        }

    def log(self, n: int) -> None:
        self.services.attempt_log(**self.epochs, message=f"bench line {n}")

    def checkpoint(self, n: int) -> None:
        checkpoint = self.services.checkpoint_save(**self.epochs, step="ask", state={"n": n})
        self.checkpoint_id = checkpoint.id

    def ask(self, n: int) -> None:
        request = self.services.attempt_interrupt(
            **self.epochs,
            checkpoint_id=self.checkpoint_id,
            kind="input_required",
            prompt=f"Which version? ({n})",
            accepted_schema=ANSWER_SCHEMA,
            expires_in=3600,
        )
        self.request_id = request.id

    def answer(self, n: int) -> None:
        self.services.run_resume(
            run_id=self.run_id,
            request_id=self.request_id,
            checkpoint_id=self.checkpoint_id,
            value={"version": f"v{n}"},
            user=self.answerer,
        )

    def claim_again(self, n: int) -> None:
        self.claim()

    def cycle(self) -> list[tuple[str, Callable[[int], None]]]:
        """(what changes for the pages, the step)"""
        return [
            ("shared", self.log),
            # A new checkpoint changes what the retry form offers: the user's part too.
            ("per user", self.checkpoint),
            ("per user", self.ask),
            ("per user", self.answer),
            ("per user", self.claim_again),
        ]


@contextlib.contextmanager
def py_spy(pid: int, path: Path | None) -> Iterator[None]:
    """Sample ``pid`` with py-spy (collapsed stacks in ``path``) while the block runs."""
    if path is None:
        yield
        return
    exe = shutil.which("py-spy", path=str(Path(PYTHON).parent)) or shutil.which("py-spy")
    if exe is None:
        raise SystemExit("--profile needs py-spy (the bench extra)")
    proc = subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "250",
            "--nonblocking",
            "--format",
            "raw",
            "-o",
            str(path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        proc.send_signal(2)  # SIGINT: py-spy writes the file and exits
        proc.wait(30)


def profile_summary(path: Path, *, top: int = 25) -> list[tuple[str, float]]:
    """Share of the render thread's samples spent in each function (inclusive)."""
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "render_batch" not in stack:
            continue
        frames = stack.split(";")
        total += int(count)
        for frame in set(frames[frames.index(next(f for f in frames if "render_batch" in f)) :]):
            inclusive[frame] += int(count)
    return [(frame, count / total) for frame, count in inclusive.most_common(top)] if total else []


def full_path(
    base: str,
    worker: Worker,
    cookies: list[str],
    pushes: int,
    cpu: Callable[[], float],
    profiled: Callable[[], contextlib.AbstractContextManager[None]],
) -> dict[str, Any]:
    """Latencies (seconds) of each push, by what it changed; the frames that were not it;
    the web process's CPU seconds per push."""
    from runs.models import Run

    seq = Run.objects.get(pk=worker.run_id).last_event_seq
    url = base.replace("http://", "ws://") + f"/ws/runs/{worker.run_id}/?v={seq}"
    marker = f'id="run-{worker.run_id}-timeline"'
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(
        target=_websocket_clients,
        args=(url, base, cookies, marker, pushes, ready, out),
        daemon=True,
    )
    proc.start()
    if not ready.wait(120):
        proc.terminate()
        raise RuntimeError("the websocket clients did not connect")
    time.sleep(0.5)
    steps = worker.cycle()
    latencies: dict[str, list[float]] = {"shared": [], "per user": []}
    stray = 0
    # Sampled from here on: the pushes, not the connections and their first renders.
    with profiled():
        cpu0 = cpu()
        for n in range(pushes):
            kind, step = steps[n % len(steps)]
            step(n)
            committed = time.monotonic()  # the commit has returned; the push is on its way
            got, arrivals, extra = out.get(timeout=120)
            if got != n:
                raise RuntimeError(f"the websocket clients failed: {extra}")
            latencies[kind] += [arrived - committed for arrived in arrivals]
            stray += extra
            time.sleep(0.2)  # let the web process go idle between pushes
        cpu_per_push = (cpu() - cpu0) / pushes
    proc.join(30)
    return {"latencies": latencies, "stray": stray, "cpu_per_push": cpu_per_push}


# --- Main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--messages", type=int, default=30, help="pushes (commits) to time")
    parser.add_argument("--roles", default="viewer,operator,approver")
    parser.add_argument("--profile", type=Path, help="py-spy the web process into this file")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--server-log", type=Path, help="append the server's output to this file")
    parser.add_argument(
        "--server",
        default="daphne",
        choices=[k for k in SERVERS if "wsgi" not in k and k != "gunicorn"],
        help="the ASGI server (default daphne)",
    )
    opts = parser.parse_args(argv)
    redis_url = os.environ.get("REDIS_URL", "")
    if not redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise SystemExit("bench.push needs Redis: set REDIS_URL=redis://127.0.0.1:6379/N")
    roles = [r.strip() for r in opts.roles.split(",") if r.strip()]
    prefix = f"holdpoint-bench-{os.getpid()}"

    bare = Summary.of(
        s * 1000
        for s in bare_round_trip(redis_url, prefix + "-floor", opts.subscribers, opts.messages)
    )

    with scratch_database("push", keep=opts.keep):
        env = {
            "REDIS_URL": redis_url,
            "CHANNEL_PREFIX": prefix,
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
        }
        os.environ.update(env)
        setup_django()
        cookies, answerer = people_with_sessions(opts.subscribers, roles)
        worker = Worker(answerer)
        with web_server(opts.server, env=env, log=opts.server_log) as server:
            result = full_path(
                server.base,
                worker,
                cookies,
                opts.messages,
                server.cpu_seconds,
                lambda: py_spy(server.pid, opts.profile),
            )

    latencies = result["latencies"]
    full = Summary.of(s * 1000 for values in latencies.values() for s in values)
    shared = Summary.of(s * 1000 for s in latencies["shared"])
    per_user = Summary.of(s * 1000 for s in latencies["per user"])

    def ratio(s: Summary) -> str:
        return f"{s.p99 / bare.p99:.1f}x" if bare.p99 else "-"

    n = opts.subscribers
    rows = [
        [f"bare channel layer: group_send -> {n} receivers", bare.n, *_figures(bare), "1.0x"],
        [f"commit -> {n} websocket clients have the fragment", full.n, *_figures(full), ratio(full)],
        ["… of which log lines (the shared parts)", shared.n, *_figures(shared), ratio(shared)],
        ["… of which checkpoint, ask, answer, claim (+ user's)", per_user.n, *_figures(per_user), ratio(per_user)],
    ]  # fmt: skip
    print()
    print(
        f"Push latency (ms), {n} websocket clients on one run page ({', '.join(roles)} in turn), "
        f"one {opts.server} process, Redis channel layer"
    )
    print(table(["path", "n", "p50", "p95", "p99", "max", "p99 vs bare"], rows))
    if result["stray"]:
        print(f"  ({result['stray']} other frames arrived, not counted)")
    cpu_ms = result["cpu_per_push"] * 1000
    print(f"  {opts.server} CPU per push: {cpu_ms:.1f} ms for {n} sockets")
    target = (
        f"full path p99 {full.p99:.1f} ms ({verdict(full.p99 < TARGET_P99_MS)} "
        f"< {TARGET_P99_MS:.0f} ms); bare channel layer p99 {bare.p99:.1f} ms"
    )
    print("Target: " + target)
    figures: dict[str, Any] = {
        "subscribers": n,
        "messages": opts.messages,
        "roles": roles,
        "bare_channel_layer_ms": bare.as_dict(),
        "full_path_ms": full.as_dict(),
        "full_path_shared_ms": shared.as_dict(),
        "full_path_per_user_ms": per_user.as_dict(),
        "server": opts.server,
        "server_cpu_ms_per_push": round(cpu_ms, 2),
        "stray_frames": result["stray"],
        "targets": [target],
    }
    if opts.profile:
        print(f"\nWhere the render thread spent its samples (inclusive; {opts.profile}):")
        for frame, share in profile_summary(opts.profile):
            print(f"  {share:6.1%}  {frame}")
    save_result("push", figures)
    return figures


def _figures(s: Summary) -> list[float]:
    return [s.p50, s.p95, s.p99, s.max]


if __name__ == "__main__":
    main()
