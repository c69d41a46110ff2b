"""Print a run's timeline as it grows: ``manage.py watchrun RUN_ID``."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.migrated import require_migrated
from runs.models import Run
from runtime.management.commands._cli import watch


class Command(BaseCommand):
    help = "Print a run's events until it finishes (or, with --stop-at-hold, until it asks)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("--stop-at-hold", action="store_true")
        parser.add_argument("--timeout", type=float, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated()
        if not Run.objects.filter(pk=options["run_id"]).exists():
            raise CommandError(f"There is no run {options['run_id']!r}.")
        run = watch(
            self.stdout,
            options["run_id"],
            through_holds=not options["stop_at_hold"],
            timeout=options["timeout"],
        )
        self.stdout.write(f"\n{run.id}: {run.status} {run.failure_class}".rstrip())
        if run.result is not None:
            import json

            self.stdout.write(f"result: {json.dumps(run.result, ensure_ascii=False)}")
