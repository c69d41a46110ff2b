"""Run the demo webhook receiver: ``python manage.py demoreceiver --port 8765``."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runtime.demo_receiver import DemoReceiver


class Command(BaseCommand):
    help = "Receive the demo agents' webhooks (idempotent, with a lookup by key)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8765)

    def handle(self, *args: Any, **options: Any) -> None:
        receiver = DemoReceiver(options["host"], options["port"]).start()
        self.stdout.write(
            f"demo receiver on {receiver.url}\n"
            f"  export HOLDPOINT_WEBHOOK_LOOKUP_URL='{receiver.lookup_url()}'\n"
            # Workers refuse loopback destinations unless told otherwise (ledger/outbound.py).
            "  export HOLDPOINT_OUTBOUND_ALLOW_LOCAL=true   # for the workers that post here"
        )
        self.stdout.flush()
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *a: stop.set())
        signal.signal(signal.SIGINT, lambda *a: stop.set())
        stop.wait()
        receiver.stop()
