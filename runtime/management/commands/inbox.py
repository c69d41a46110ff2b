"""The questions and approvals waiting for a person: ``manage.py inbox [--as USER]``.

The same query as the dashboard's inbox and ``GET /api/inbox`` (``inbox_for_user``): with
``--as``, what that user may answer; without, every pending request.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runs.migrated import require_migrated
from runs.models import InputRequest
from runs.selectors import inbox_for_user
from runs.states import RequestKind, RequestStatus
from runtime.management.commands._cli import print_request, user_named


class Command(BaseCommand):
    help = "List the pending questions and approvals, soonest expiry first."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--as", dest="username", default=None, help="Only what this user may answer."
        )
        parser.add_argument("--limit", type=int, default=50)
        parser.add_argument("--long", action="store_true", help="Show each request in full.")

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated()
        user = user_named(options["username"])
        if user is not None:
            requests = inbox_for_user(user=user)
        else:
            requests = (
                InputRequest.objects.filter(status=RequestStatus.PENDING)
                .exclude(kind=RequestKind.PAUSE)
                .select_related("run")
                .order_by("expires_at", "id")
            )
        limit = max(1, min(options["limit"], 1000))
        shown = list(requests[: limit + 1])
        if not shown:
            self.stdout.write("Nothing is waiting for a person.")
            return
        for request in shown[:limit]:
            if options["long"]:
                print_request(self.stdout, request)
                continue
            self.stdout.write(
                f"{request.expires_at:%Y-%m-%d %H:%M} {request.kind:<15} {request.run_id} "
                f"{request.run.agent}: {request.prompt[:100]}"
            )
        if len(shown) > limit:
            self.stdout.write(f"… more than {limit}; use --limit")
