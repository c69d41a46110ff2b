"""Run agents: ``python manage.py runagents --concurrency N [--agents a,b]``."""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.migrated import require_migrated
from runtime.devloop import ImportsReport, hold_worker_lock, reload_forever
from runtime.worker import WorkerPool


class Command(BaseCommand):
    help = (
        "Claim due attempts and run their agents, with heartbeats, checkpoints and sweeps. "
        "SIGTERM or Ctrl-C stops gracefully (finish the step, release the lease); "
        "a second signal stops at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency", type=int, default=1, help="Worker threads (attempts at once)."
        )
        parser.add_argument(
            "--agents",
            default="",
            help="Comma-separated agent names to run (default: every registered agent).",
        )
        parser.add_argument(
            "--lease-seconds",
            type=float,
            default=None,
            help="Lease of a claimed attempt; heartbeats every third of it "
            "(default HOLDPOINT_LEASE_SECONDS).",
        )
        parser.add_argument(
            "--poll-interval",
            type=float,
            default=None,
            help="Seconds an idle worker waits before looking for work again "
            "(default 0.5 on SQLite; 5 on PostgreSQL, where NOTIFY wakes it at once).",
        )
        parser.add_argument(
            "--sweep-interval", type=float, default=1.0, help="Seconds between sweeps."
        )
        parser.add_argument(
            "--no-sweep", action="store_true", help="Do not sweep (another process does)."
        )
        parser.add_argument(
            "--grace-seconds",
            type=float,
            default=None,
            help="How long a graceful stop waits for running steps (default: the lease).",
        )
        parser.add_argument("--name", default=None, help="Worker name prefix (default host:pid).")
        parser.add_argument(
            "--reload",
            action="store_true",
            help="Develop an agent: restart the workers when an agent module or a Python file "
            "it imports changes (each restart releases the leases first).",
        )
        parser.add_argument(
            "--reload-interval",
            type=float,
            default=1.0,
            help="With --reload: seconds between looks at the files.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated()
        concurrency: int = options["concurrency"]
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1.")
        agents = [a.strip() for a in options["agents"].split(",") if a.strip()]
        lease_seconds = options["lease_seconds"]
        if lease_seconds is not None and not 0.1 <= lease_seconds <= 3600:
            raise CommandError("--lease-seconds must be between 0.1 and 3600.")
        try:
            pool = WorkerPool(
                concurrency,
                agents or None,
                lease_seconds=lease_seconds,
                poll_interval=options["poll_interval"],
                sweep=not options["no_sweep"],
                sweep_interval=options["sweep_interval"],
                name=options["name"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if not pool.agents:
            raise CommandError("No agents are registered; list modules in HOLDPOINT_AGENT_MODULES.")
        if options["reload"]:
            reload_forever(options, self.stdout)
            return
        # On SQLite one process runs workers (runtime/devloop.py); held until we exit.
        lock = hold_worker_lock(f"runagents {pool.name}")  # noqa: F841 - held while running

        stopping = threading.Event()
        force = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if stopping.is_set():
                force.set()
            stopping.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

        pool.start()
        if pool.listen:
            # Announce readiness once notifications reach us, so nothing sent is missed.
            pool.listening.wait(10)
        self.stdout.write(
            f"runagents {pool.name}: {concurrency} workers for {', '.join(pool.agents)} "
            f"({'LISTEN/NOTIFY' if pool.listen else f'polling every {pool.poll_interval}s'})",
        )
        self.stdout.flush()
        # Under --reload: the files to watch are those the agents imported (runtime/devloop.py).
        imports = ImportsReport.from_env()
        imports.refresh()
        while not stopping.wait(0.5):
            imports.refresh()
            if not pool.alive():
                raise CommandError("Every worker thread stopped; see the log.")
        grace = options["grace_seconds"]
        if grace is None:
            grace = lease_seconds or float(settings.HOLDPOINT_LEASE_SECONDS)
        self.stdout.write("runagents: stopping (finishing steps, releasing leases)")
        self.stdout.flush()
        pool.stop(timeout=grace, force=force)
        self.stdout.write("runagents: stopped")
        self.stdout.flush()
