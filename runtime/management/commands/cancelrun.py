"""Cancel a run: ``manage.py cancelrun RUN_ID [--reason …] [--as USER]``.

The same service as ``POST /api/runs/{id}/cancel`` and the dashboard's **Cancel**.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.audit import CLI, shell_identity
from runs.errors import HoldpointError
from runs.migrated import require_migrated
from runs.services import run_cancel
from runtime.management.commands._cli import user_named


class Command(BaseCommand):
    help = "Cancel a run (a live attempt stops at its next safe point)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("--reason", default="", help="Why (shown on the timeline).")
        parser.add_argument("--as", dest="username", default=None, help="Cancel as this user.")

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated()
        user = user_named(options["username"])
        try:
            run = run_cancel(
                run_id=options["run_id"],
                user=user,
                actor=None if user else "cli",
                reason=options["reason"],
                via=CLI,
                identity=shell_identity(),
            )
        except HoldpointError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        self.stdout.write(f"{run.id}: {run.status}")
