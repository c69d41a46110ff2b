"""Push latency through Redis: 100 subscribers, time from send to each one receiving.

Measured now: the bare channel-layer round trip (channels_redis, ``REDIS_URL``): 100
channels in one group, in a separate subscriber process, and a sender that
``group_send``s a message every 50 ms; latency = receive time - send time
(``time.monotonic()``, one clock on the machine). This is the floor under the real
push (commit -> ``on_commit`` -> channel layer -> consumer renders the fragment ->
websocket frame).

The full path (100 websocket clients through daphne, from the committing
transaction to each client receiving the rendered fragment) needs the websocket
consumers of issue 7; while ``config.asgi`` routes no websocket, this script says so
and measures only the channel layer. Target for the full path: p99 < 50 ms.

    python -m bench.push [--subscribers 100] [--messages 50]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import time
from typing import Any

from bench.common import Summary, save_result, setup_django, table, verdict

GROUP = "bench-push"


def _subscribers(url: str, prefix: str, count: int, messages: int, ready: Any, out: Any) -> None:
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
        await layer.flush()
        out.put(latencies)

    asyncio.run(main())


def bare_round_trip(url: str, subscribers: int, messages: int) -> list[float]:
    from channels_redis.core import RedisChannelLayer

    prefix = f"holdpoint-bench-{os.getpid()}-"
    ctx = mp.get_context("fork")
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_subscribers, args=(url, prefix, subscribers, messages, ready, out))
    proc.start()
    ready.wait(60)
    time.sleep(0.2)

    async def send() -> None:
        layer = RedisChannelLayer(hosts=[url], prefix=prefix)
        for seq in range(messages):
            await layer.group_send(
                GROUP, {"type": "bench.push", "seq": seq, "sent": time.monotonic()}
            )
            await asyncio.sleep(0.05)
        await layer.close_pools()

    asyncio.run(send())
    latencies = out.get(timeout=300)
    proc.join(30)
    return latencies


def websocket_routed() -> bool:
    setup_django()
    from config.asgi import application

    routes = getattr(application, "application_mapping", {})
    return "websocket" in routes


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--messages", type=int, default=50)
    opts = parser.parse_args(argv)
    url = os.environ.get("REDIS_URL", "")
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise SystemExit("bench.push needs Redis: set REDIS_URL=redis://127.0.0.1:6379/N")

    bare = Summary.of(s * 1000 for s in bare_round_trip(url, opts.subscribers, opts.messages))
    rows = [
        [
            f"bare channel layer, group_send -> {opts.subscribers} receivers",
            bare.n,
            bare.p50,
            bare.p95,
            bare.p99,
            bare.max,
        ]
    ]
    routed = websocket_routed()
    if routed:
        missing = (
            "config.asgi routes websockets, but this script does not yet drive the consumers "
            "(message format of issue 7 unknown when it was written)."
        )
    else:
        missing = (
            "not measured: config.asgi routes no websocket yet (the consumers of issue 7 have "
            "not landed), so there is no fragment to receive."
        )
    rows.append(
        [f"commit -> {opts.subscribers} websocket clients get the fragment", "", "", "", "", ""]
    )
    print()
    print("Push latency (ms)")
    print(table(["path", "n", "p50", "p95", "p99", "max"], rows))
    print(f"  full path: {missing}")
    print(
        f"  bare channel layer p99 {bare.p99:.1f} ms ({verdict(bare.p99 < 50)} < 50 ms as a floor)"
    )
    figures = {
        "subscribers": opts.subscribers,
        "bare_channel_layer_ms": bare.as_dict(),
        "websocket_path": None,
        "missing": missing,
        "targets": [f"full path p99 < 50 ms: {missing}"],
    }
    save_result("push", figures)
    return figures


if __name__ == "__main__":
    main()
