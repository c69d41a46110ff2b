"""Answer a run's open question: ``manage.py answerrun RUN_ID '{"versions": ["v2"]}'``.

The same service the API's ``POST /api/runs/{id}/resume`` calls, for the run's pending
request on the checkpoint it was asked on.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.audit import CLI, shell_identity
from runs.errors import HoldpointError
from runs.migrated import require_migrated
from runs.models import Run
from runs.services import run_resume


class Command(BaseCommand):
    help = "Answer the pending input request or approval of a run with a JSON value."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id")
        parser.add_argument("value", help='The answer as JSON, e.g. \'{"decision": "approve"}\'.')
        parser.add_argument("--as", dest="username", default=None, help="Answer as this user.")

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated()
        run = Run.objects.select_related("pending_request").filter(pk=options["run_id"]).first()
        if run is None:
            raise CommandError(f"There is no run {options['run_id']!r}.")
        if run.pending_request is None:
            raise CommandError(f"The run is {run.status}; it is not waiting for an answer.")
        try:
            value = json.loads(options["value"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"The answer is not JSON: {exc}") from exc
        user = None
        if options["username"]:
            user = get_user_model().objects.filter(username=options["username"]).first()
            if user is None:
                raise CommandError(f"There is no user {options['username']!r}.")
        request = run.pending_request
        try:
            run_resume(
                run_id=run.id,
                request_id=request.id,
                checkpoint_id=request.checkpoint_id or "",
                value=value,
                user=user,
                actor=None if user else "cli",
                via=CLI,
                identity=shell_identity(),
            )
        except HoldpointError as exc:
            raise CommandError(f"{exc.code}: {exc.detail} {exc.extra or ''}".strip()) from exc
        self.stdout.write(f"answered {request.id}; the run is queued to go on")
