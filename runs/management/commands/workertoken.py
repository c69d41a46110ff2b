"""Worker tokens for the worker API: create (printed once), scope, revoke, list.

    python manage.py workertoken create triage-host --agents triage,ticket-bot
    python manage.py workertoken scope triage-host --agents triage     (or --any)
    python manage.py workertoken list

A token's scope is the agents it may serve (claim their runs, declare them, report their
side effects); a token without one may serve any agent that no other token owns.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_slug

from runs.migrated import require_migrated
from runs.models import WorkerToken
from runs.tokens import worker_token_create, worker_token_revoke, worker_token_scope


class Command(BaseCommand):
    help = (
        "Manage worker tokens: create NAME (prints the token once), scope NAME, revoke NAME, list."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser(
            "create", help="Create a token; it is printed once, only its hash is kept."
        )
        create.add_argument("name", help="A name for the worker (letters, digits, - and _).")
        create.add_argument(
            "--agents",
            default="",
            help="Comma-separated agents it may serve (default: any agent no other token owns).",
        )
        scope = sub.add_parser("scope", help="Set the agents the active token of NAME may serve.")
        scope.add_argument("name")
        which = scope.add_mutually_exclusive_group(required=True)
        which.add_argument("--agents", help="Comma-separated agent names.")
        which.add_argument("--any", action="store_true", help="Any agent no other token owns.")
        revoke = sub.add_parser("revoke", help="Revoke the active token of NAME.")
        revoke.add_argument("name")
        sub.add_parser("list", help="List tokens, active and revoked.")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        require_migrated()
        if action == "create":
            name = options["name"]
            try:
                validate_slug(name)
            except ValidationError:
                raise CommandError(
                    f"{name!r} is not a valid name; use letters, digits, - and _."
                ) from None
            try:
                token, secret = worker_token_create(name=name, agents=_names(options["agents"]))
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            self.stderr.write(
                f"Created worker token {token.name!r}. Store it now: it is not shown again."
            )
            self.stdout.write(secret)
        elif action == "scope":
            agents = [] if options["any"] else _names(options["agents"] or "")
            try:
                token = worker_token_scope(name=options["name"], agents=agents)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"Worker token {token.name!r} may serve: {_scope(token)}.")
        elif action == "revoke":
            if not worker_token_revoke(name=options["name"]):
                raise CommandError(f"There is no active worker token named {options['name']!r}.")
            self.stdout.write(f"Revoked worker token {options['name']!r}.")
        else:
            tokens = WorkerToken.objects.order_by("name", "-created_at")
            if not tokens:
                self.stdout.write("No worker tokens.")
                return
            self.stdout.write(
                f"{'NAME':<24} {'PREFIX':<12} {'CREATED':<20} {'LAST USED':<20} {'STATE':<28} SCOPE"
            )
            for token in tokens:
                state = f"revoked {_when(token.revoked_at)}" if token.revoked_at else "active"
                self.stdout.write(
                    f"{token.name:<24} {token.prefix:<12} {_when(token.created_at):<20} "
                    f"{_when(token.last_used_at):<20} {state:<28} {_scope(token)}"
                )


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _scope(token: WorkerToken) -> str:
    return ", ".join(token.agents) if token.agents else "any agent no other token owns"
