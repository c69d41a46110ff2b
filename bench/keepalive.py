"""Does the web server's keep-alive timeout race the clients' reuse of an idle connection?

Starts the Procfile's web server (``bench.common.web_server``: uvicorn, a worker per core)
with ``--timeout-keep-alive SECONDS``; ``--clients`` httpx clients (``keepalive_expiry``
5 s, httpx's default, as holdpoint_client and bench.capacity use) each send ``GET
/healthz``, then three times wait 4.9-5.1 s and send it again on the pooled connection.
Prints the transport errors (``ReadError``, ``RemoteProtocolError``: the server closed the
connection as the request went out). With uvicorn's default 5 s there are some; with the
Procfile's 75 s none (docs/operations.md, Overload).

    python -m bench.keepalive [SECONDS] [--clients 200]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random

from bench.common import KEEP_ALIVE_SECONDS, web_server


async def _client(base: str, errors: collections.Counter[str], rng: random.Random) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        await client.get("/healthz")
        for _ in range(3):
            await asyncio.sleep(rng.uniform(4.9, 5.1))
            try:
                await client.get("/healthz")
            except httpx.TransportError as exc:
                errors[type(exc).__name__] += 1


async def _clients(base: str, n: int) -> collections.Counter[str]:
    errors: collections.Counter[str] = collections.Counter()
    rng = random.Random(1)
    await asyncio.gather(*(_client(base, errors, rng) for _ in range(n)))
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("keep_alive", nargs="?", type=int, default=KEEP_ALIVE_SECONDS)
    parser.add_argument("--clients", type=int, default=200)
    opts = parser.parse_args(argv)
    with web_server("uvicorn", workers=2, env={"WEB_KEEP_ALIVE": str(opts.keep_alive)}) as server:
        errors = asyncio.run(_clients(server.base, opts.clients))
    print(
        f"server keep-alive {opts.keep_alive} s, httpx keepalive_expiry 5 s, {opts.clients} "
        f"clients x 3 reuses after 4.9-5.1 s idle: transport errors "
        f"{sum(errors.values())} {dict(errors) if errors else ''}".rstrip()
    )
    return sum(errors.values())


if __name__ == "__main__":
    main()
