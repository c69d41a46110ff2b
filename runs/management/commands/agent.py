"""Declare agents served by HTTP workers in other languages, so ``POST /api/runs`` accepts them.

    python manage.py agent declare triage --input-schema triage.schema.json \
        --retry-policy policy.json --tools webhook,email --description "Ticket triage"
    python manage.py agent list
    python manage.py agent remove triage
    python manage.py agent pause triage --reason "model misbehaves, INC-42"
    python manage.py agent unpause triage --reason "rolled back"

    python manage.py agent policy deploy --required 2 --groups approvers --self-approval no
    python manage.py agent policy deploy --file policy.json     (rules per tool/target)
    python manage.py agent policy deploy --clear                (back to the agent's code)

    python manage.py agent owners triage                        (which worker tokens own it)
    python manage.py agent owners triage --add host-b --remove host-a

``policy`` shows or sets who may approve the agent's approvals and how many must (an
operator's policy overrides the one in the agent's code; docs/agents.md).
``pause`` closes the agent's gate (the kill switch): nothing of it is claimed and every
running attempt stops at its next step boundary; ``unpause`` lets its runs go on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_slug

from runs.agents import (
    RetryPolicy,
    agent_spec,
    all_agent_specs,
    approval_policy_for,
    python_agent_specs,
)
from runs.approvals import parse_policy
from runs.audit import CLI, shell_identity
from runs.errors import HoldpointError
from runs.migrated import require_migrated
from runs.models import AgentApprovalPolicy, DeclaredAgent
from runs.schemas import compile_schema
from runs.selectors import agent_overview
from runs.services import agent_owners_set, agent_pause, agent_unpause


def _read_json(path: str, what: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"Cannot read the {what} {path!r}: {exc.strerror}.") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"The {what} {path!r} is not JSON: {exc}.") from None


class Command(BaseCommand):
    help = "Declare, list or remove agents served by HTTP workers."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        declare = sub.add_parser("declare", help="Declare (or update) an agent by name.")
        declare.add_argument("name")
        declare.add_argument("--input-schema", metavar="FILE", help="JSON Schema of the input.")
        declare.add_argument(
            "--retry-policy", metavar="FILE", help="JSON object: RetryPolicy fields."
        )
        declare.add_argument("--tools", default="", help="Comma-separated tool names.")
        declare.add_argument("--description", default="")
        remove = sub.add_parser("remove", help="Remove a declared agent (its runs stay).")
        remove.add_argument("name")
        sub.add_parser("list", help="List Python and declared agents, with their gates.")
        pause = sub.add_parser(
            "pause", help="Pause every run of an agent at its next step boundary."
        )
        pause.add_argument("name")
        pause.add_argument("--reason", required=True, help="Why; shown to everyone.")
        unpause = sub.add_parser("unpause", help="Let a paused agent's runs go on.")
        unpause.add_argument("name")
        unpause.add_argument("--reason", default="")
        owners = sub.add_parser(
            "owners",
            help="Show or change the worker tokens a declared agent belongs to (only they "
            "may declare it and claim its runs).",
        )
        owners.add_argument("name")
        owners.add_argument("--add", default="", help="Comma-separated token names to add.")
        owners.add_argument("--remove", default="", help="Comma-separated token names to remove.")
        policy = sub.add_parser("policy", help="Show or set an agent's approval policy.")
        policy.add_argument("name")
        policy.add_argument("--file", metavar="FILE", help="The whole policy, a JSON object.")
        policy.add_argument("--groups", help="Comma-separated groups that may decide.")
        policy.add_argument("--required", type=int, help="Distinct approvals needed (N).")
        policy.add_argument("--self-approval", choices=["yes", "no", "default"])
        policy.add_argument("--any-deny-closes", choices=["yes", "no"])
        policy.add_argument("--clear", action="store_true", help="Remove the operator's policy.")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        require_migrated()
        if action == "declare":
            self._declare(options)
        elif action == "remove":
            deleted, _ = DeclaredAgent.objects.filter(name=options["name"]).delete()
            if not deleted:
                raise CommandError(f"There is no declared agent named {options['name']!r}.")
            self.stdout.write(f"Removed agent {options['name']!r}.")
        elif action == "policy":
            self._policy(options)
        elif action == "owners":
            self._owners(options)
        elif action in ("pause", "unpause"):
            self._gate(action, options["name"], options["reason"])
        else:
            for spec in all_agent_specs():
                row = agent_overview(spec.name) or {}
                state = "PAUSED" if row.get("paused") else "open"
                self.stdout.write(f"{spec.name:<30} {spec.source:<9} {state:<7} {spec.description}")

    def _gate(self, action: str, name: str, reason: str) -> None:
        try:
            if action == "pause":
                agent_pause(
                    agent=name, reason=reason, actor="cli", via=CLI, identity=shell_identity()
                )
            else:
                agent_unpause(
                    agent=name, reason=reason, actor="cli", via=CLI, identity=shell_identity()
                )
        except HoldpointError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from None
        row = agent_overview(name) or {}
        if action == "pause":
            self.stdout.write(
                f"Paused agent {name!r}: {row.get('running_attempts', 0)} running attempts "
                f"will stop at their next step; {row.get('held_runs', 0)} queued runs will wait."
            )
        else:
            self.stdout.write(f"Unpaused agent {name!r}: its runs go on.")

    def _owners(self, options: dict[str, Any]) -> None:
        name = options["name"]
        add = [t.strip() for t in options["add"].split(",") if t.strip()]
        remove = {t.strip() for t in options["remove"].split(",") if t.strip()}
        try:
            owners = agent_owners_set(name=name, add=add, remove=remove, actor="cli")
        except HoldpointError as exc:
            raise CommandError(f"{exc.code}: {exc.detail}") from None
        self.stdout.write(
            f"{name}: owned by {', '.join(owners)}"
            if owners
            else f"{name}: owned by no token (only an administrator declares it)"
        )

    def _policy(self, options: dict[str, Any]) -> None:
        name = options["name"]
        try:
            agent_spec(name)
        except HoldpointError as exc:
            raise CommandError(exc.detail) from None
        if options["clear"]:
            AgentApprovalPolicy.objects.filter(agent=name).delete()
        changes: dict[str, Any] = {}
        if options["groups"] is not None:
            changes["groups"] = [g.strip() for g in options["groups"].split(",") if g.strip()]
        if options["required"] is not None:
            changes["required"] = options["required"]
        if options["self_approval"]:
            # "default": not for irreversible effects, yes for the rest.
            changes["self_approval"] = {"yes": True, "no": False}.get(options["self_approval"])
        if options["any_deny_closes"]:
            changes["any_deny_closes"] = options["any_deny_closes"] == "yes"
        if options["file"] or changes:
            base = _read_json(options["file"], "policy") if options["file"] else None
            if base is None:
                base, _source = approval_policy_for(name)
            if not isinstance(base, dict):
                raise CommandError("The policy must be a JSON object.")
            try:
                checked = parse_policy({**base, **changes})
            except ValueError as exc:
                raise CommandError(f"The approval policy is not valid: {exc}.") from None
            AgentApprovalPolicy.objects.update_or_create(agent=name, defaults={"policy": checked})
        policy, source = approval_policy_for(name)
        self.stdout.write(f"{name}: approval policy from {source}")
        self.stdout.write(json.dumps(policy, indent=2, sort_keys=True))

    def _declare(self, options: dict[str, Any]) -> None:
        name = options["name"]
        try:
            validate_slug(name)
        except ValidationError:
            raise CommandError(
                f"{name!r} is not a valid agent name; use letters, digits, - and _."
            ) from None
        if any(spec.name == name for spec in python_agent_specs()):
            raise CommandError(
                f"A Python agent named {name!r} is registered; a declaration would never be used."
            )
        input_schema: dict[str, Any] = {}
        if options["input_schema"]:
            input_schema = _read_json(options["input_schema"], "input schema")
            try:
                compile_schema(input_schema)
            except HoldpointError as exc:
                raise CommandError(exc.detail) from None
        retry_policy: dict[str, Any] = {}
        if options["retry_policy"]:
            retry_policy = _read_json(options["retry_policy"], "retry policy")
            if not isinstance(retry_policy, dict):
                raise CommandError("The retry policy must be a JSON object.")
            try:
                RetryPolicy.from_dict(retry_policy)
            except (TypeError, ValueError) as exc:
                raise CommandError(f"The retry policy is not valid: {exc}.") from None
        tools = [t.strip() for t in options["tools"].split(",") if t.strip()]
        _, created = DeclaredAgent.objects.update_or_create(
            name=name,
            defaults={
                "input_schema": input_schema,
                "retry_policy": retry_policy,
                "tools": tools,
                "description": options["description"],
            },
        )
        self.stdout.write(f"{'Declared' if created else 'Updated'} agent {name!r}.")
