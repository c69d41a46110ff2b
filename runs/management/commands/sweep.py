"""Run the sweeps that every worker also runs: for cron, tests, or a box with no workers."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runs.migrated import require_migrated
from runs.services import sweep_all


class Command(BaseCommand):
    help = "Expire leases and input requests, queue due backoffs, purge old idempotency records."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Sweep once and exit.")
        parser.add_argument("--interval", type=float, default=1.0, help="Seconds between sweeps.")

    def handle(self, *args: Any, once: bool, interval: float, **options: Any) -> None:
        require_migrated()
        while True:
            report = sweep_all()
            if once or report.total:
                self.stdout.write(
                    f"leases_expired={report.leases_expired} requests_expired={report.requests_expired} "
                    f"backoffs_due={report.backoffs_due} "
                    + " ".join(f"{k}={v}" for k, v in report.other.items())
                )
            if once:
                return
            time.sleep(interval)
