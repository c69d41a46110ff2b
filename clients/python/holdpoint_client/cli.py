"""``holdpoint-worker --url URL --token hpw_… module:agent [--concurrency N]``.

``module:agent`` is imported with the current directory first on ``sys.path`` (run it from
the directory that holds your agents' package); ``agent`` names an ``Agent`` or a list.

SIGTERM or SIGINT: stop claiming, let the current steps finish (``ctx.sleep`` included)
for ``--grace`` seconds and release every lease at the step boundary (another worker goes
on from the checkpoints), exit. The token may come from ``HOLDPOINT_TOKEN`` instead.
A declaration the server refuses (a 4xx) exits with status 1 and the server's reason.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from typing import Any

from holdpoint_client.agent import Agent
from holdpoint_client.worker import DeclarationRefused, Worker


def load(target: str) -> list[Agent]:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"{target!r}: expected module:agent")
    sys.path.insert(0, os.getcwd())
    value: Any = getattr(importlib.import_module(module_name), attr)
    agents = list(value) if isinstance(value, list | tuple) else [value]
    if not all(isinstance(a, Agent) for a in agents):
        raise SystemExit(f"{target!r} is not a holdpoint_client.Agent")
    return agents


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="holdpoint-worker", description=__doc__)
    parser.add_argument("--url", required=True, help="The Holdpoint server, http://host:port")
    parser.add_argument("--token", default=os.environ.get("HOLDPOINT_TOKEN", ""))
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument(
        "--name",
        default=None,
        help="This worker's name on the Workers page (default: host:pid; at most 100 characters)",
    )
    parser.add_argument("--lease-seconds", type=float, default=None)
    parser.add_argument("--wait", type=float, default=20.0, help="Long-poll seconds per claim")
    parser.add_argument("--grace", type=float, default=10.0, help="Seconds to finish at SIGTERM")
    parser.add_argument("targets", nargs="+", metavar="module:agent")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("--token (or HOLDPOINT_TOKEN) is required")
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    agents = [agent for target in args.targets for agent in load(target)]
    worker = Worker(
        args.url,
        args.token,
        agents,
        concurrency=args.concurrency,
        name=args.name,
        lease_seconds=args.lease_seconds,
        wait=args.wait,
    )
    stopping = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stopping.set()
        worker.shutdown.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        worker.start()
    except DeclarationRefused as exc:
        print(f"holdpoint-worker: {exc}", file=sys.stderr, flush=True)
        worker.stop(grace=0)
        return 1
    print(
        f"holdpoint-worker {worker.name}: serving {', '.join(a.name for a in agents)}", flush=True
    )
    while not stopping.wait(0.5):
        pass
    worker.stop(grace=args.grace)
    print(f"holdpoint-worker {worker.name}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
