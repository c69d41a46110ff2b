"""Retry a failed or cancelled run: ``manage.py retryrun RUN_ID --reason …
[--from-checkpoint CP_ID] [--as USER]``.

The same service as ``POST /api/runs/{id}/retry`` and the dashboard's **Retry**: a new
attempt from the latest checkpoint, or from the one named.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.audit import CLI, shell_identity
from runs.errors import HoldpointError
from runs.migrated import require_migrated
from runs.services import run_retry
from runtime.management.commands._cli import user_named


class Command(BaseCommand):
    help = "Retry a failed or cancelled run from its latest checkpoint (or another)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("--reason", required=True, help="Why (shown on the timeline).")
        parser.add_argument(
            "--from-checkpoint",
            dest="checkpoint_id",
            default=None,
            help="The checkpoint to go on from (default: the latest).",
        )
        parser.add_argument("--as", dest="username", default=None, help="Retry as this user.")

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated()
        user = user_named(options["username"])
        try:
            run = run_retry(
                run_id=options["run_id"],
                reason=options["reason"],
                from_checkpoint_id=options["checkpoint_id"],
                user=user,
                actor=None if user else "cli",
                via=CLI,
                identity=shell_identity(),
            )
        except HoldpointError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        self.stdout.write(f"{run.id}: {run.status}")
