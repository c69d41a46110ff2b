"""Settle a side effect whose outcome is unknown: ``manage.py reconcile OPERATION_ID
confirmed|not_applied --note … [--reference REF] [--as USER]``.

The same service as ``POST /api/side-effects/{operation_id}/reconcile`` and the
dashboard's side-effect report (``side_effect_reconcile``).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.services import side_effect_reconcile
from runs.errors import HoldpointError
from runs.migrated import require_migrated
from runtime.management.commands._cli import user_named


class Command(BaseCommand):
    help = "Say how an unknown side effect really went: confirmed or not_applied."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("operation_id")
        parser.add_argument("outcome", choices=["confirmed", "not_applied"])
        parser.add_argument("--note", required=True, help="How you know (kept on the record).")
        parser.add_argument(
            "--reference", default=None, help="The external system's reference (confirmed)."
        )
        parser.add_argument("--as", dest="username", default=None, help="Settle as this user.")

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated()
        user = user_named(options["username"])
        try:
            effect = side_effect_reconcile(
                operation_id=options["operation_id"],
                outcome=options["outcome"],
                note=options["note"],
                external_reference=options["reference"],
                user=user,
                actor=None if user else "cli",
            )
        except HoldpointError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from exc
        self.stdout.write(f"{effect.operation_id}: {effect.status}")
