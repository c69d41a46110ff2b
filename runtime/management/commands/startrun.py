"""Start a run from the command line: ``manage.py startrun AGENT '{"json": "input"}' --watch``.

``--approve STEP_ID`` approves a step at start. That is an approval by a person, so it
needs ``--as USERNAME`` naming someone with the approve permission; the run records
them as the approver.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.audit import CLI, shell_identity
from runs.errors import HoldpointError
from runs.migrated import require_migrated
from runs.services import run_start
from runtime.management.commands._cli import watch


class Command(BaseCommand):
    help = "Start a run of an agent with a JSON input; with --watch, print its timeline."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("agent")
        parser.add_argument("input", nargs="?", default="{}", help="The input, as JSON.")
        parser.add_argument(
            "--approve",
            action="append",
            default=[],
            metavar="STEP_ID",
            help="An approval given at start (repeatable), e.g. notify.email. Needs --as "
            "naming a person with the approve permission.",
        )
        parser.add_argument(
            "--as",
            dest="username",
            default=None,
            help="Start the run as this user (who must hold the approve permission for --approve).",
        )
        parser.add_argument(
            "--pause-before",
            action="append",
            default=[],
            metavar="STEP",
            help="A breakpoint (repeatable): pause before this step every time it is reached.",
        )
        parser.add_argument(
            "--watch", action="store_true", help="Print the timeline until it stops or asks."
        )
        parser.add_argument(
            "--timeout", type=float, default=None, help="Stop watching after this many seconds."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated()
        try:
            value = json.loads(options["input"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"The input is not JSON: {exc}") from exc
        user = None
        if options["username"]:
            user = get_user_model().objects.filter(username=options["username"]).first()
            if user is None:
                raise CommandError(f"There is no user {options['username']!r}.")
        elif options["approve"]:
            raise CommandError(
                "--approve is an approval by a person: name them with --as USERNAME "
                "(someone with the approve permission)."
            )
        try:
            run = run_start(
                agent=options["agent"],
                input=value,
                user=user,
                actor=None if user else "cli",
                approvals=options["approve"] or None,
                pause_before=options["pause_before"] or None,
                via=CLI,
                identity=shell_identity(),
            )
        except HoldpointError as exc:
            raise CommandError(f"{exc.code}: {exc.detail} {exc.extra or ''}".strip()) from exc
        self.stdout.write(run.id)
        if options["watch"]:
            watch(self.stdout, run.id, through_holds=False, timeout=options["timeout"])
