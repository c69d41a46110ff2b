"""Start a run from the command line: ``manage.py startrun AGENT '{"json": "input"}' --watch``."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.errors import HoldpointError
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
            help="An approval given at start (repeatable), e.g. notify.email.",
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
        try:
            value = json.loads(options["input"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"The input is not JSON: {exc}") from exc
        try:
            run = run_start(
                agent=options["agent"],
                input=value,
                actor="cli",
                approvals=options["approve"] or None,
                pause_before=options["pause_before"] or None,
            )
        except HoldpointError as exc:
            raise CommandError(f"{exc.code}: {exc.detail} {exc.extra or ''}".strip()) from exc
        self.stdout.write(run.id)
        if options["watch"]:
            watch(self.stdout, run.id, through_holds=False, timeout=options["timeout"])
