"""The rules of the tools an agent calls through the MCP gateway (docs/api.md, "Tool rules").

- ``tool_rules_report``: the gateway (a worker token serving the agent) reports the tools
  it proxies; their annotations suggest a rule, nothing more.
- ``tool_rule_confirm``: a person sets a tool's rule and argument patterns.
- ``tool_rules_confirm_suggested``: a person accepts every unconfirmed tool's suggestion.

The trust rules: a tool's MCP annotations come from the downstream server and are hints,
so an unconfirmed tool asks for approval (``approve``) whatever they say; only a person
with ``ledger.change_toolrule`` sets a rule; a report never changes a person's rule and
patterns, and a tool whose description, schema or annotations changed after it was
confirmed says so (``ToolRule.changed_since_confirmed``) until someone confirms it again.
Each person's change writes an ``AgentEvent`` (the audit trail) in its transaction.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from django.db import transaction
from django.utils import timezone

from ledger.models import ToolRule, ToolRuleKind
from runs.audit import TOOL_RULE_CONFIRMED
from runs.errors import HoldpointError
from runs.events import append_agent_event, how
from runs.models import DeclaredAgent
from runs.schemas import canonical_json, too_deep
from runs.services import UserLike, actor_for, user_or_none
from runs.tokens import Serving

SERVER_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
MAX_TOOL_NAME = 128
MAX_TOOLS = 500
MAX_DESCRIPTION = 2000
MAX_SCHEMA_BYTES = 32 * 1024
MAX_PATTERNS = 20
MAX_GLOB = 200
MAX_ARGUMENT = 128
RULES = tuple(ToolRuleKind.values)
# The MCP tool annotations kept (their types); any other key is dropped.
ANNOTATIONS: dict[str, type] = {
    "readOnlyHint": bool,
    "destructiveHint": bool,
    "idempotentHint": bool,
    "openWorldHint": bool,
    "title": str,
}
MAX_TITLE = 200
# What a report writes; a person's rule, patterns and confirmation are never among them.
REPORTED_FIELDS = (
    "description",
    "input_schema",
    "annotations",
    "suggested",
    "reported_hash",
    "offered",
)


def _invalid(pointer: str, message: str) -> HoldpointError:
    return HoldpointError(
        "invalid_input", message, errors=[{"pointer": pointer, "message": message}]
    )


def suggest(annotations: dict[str, Any]) -> str:
    """The rule a tool's annotations suggest: a read passes, a side effect declared not
    destructive (explicitly) is recorded, anything else asks for approval."""
    if annotations.get("readOnlyHint") is True:
        return ToolRuleKind.PASS
    if annotations.get("destructiveHint") is False:
        return ToolRuleKind.RECORD
    return ToolRuleKind.APPROVE


def tool_hash(*, description: str, input_schema: Any, annotations: dict[str, Any]) -> str:
    """What a person confirms a rule against: the tool's description, schema and annotations."""
    text = canonical_json(
        {"description": description, "input_schema": input_schema, "annotations": annotations}
    )
    return hashlib.sha256(text.encode()).hexdigest()


def check_server(server: Any, pointer: str = "/server") -> str:
    if not isinstance(server, str) or not SERVER_RE.fullmatch(server):
        raise _invalid(
            pointer,
            "A server name is 1 to 64 of a-z, 0-9, _ and -, starting with a letter or digit.",
        )
    return server


def check_tool_name(tool: Any, pointer: str = "/name") -> str:
    if (
        not isinstance(tool, str)
        or not 1 <= len(tool) <= MAX_TOOL_NAME
        or any(not c.isprintable() or c.isspace() for c in tool)
    ):
        raise _invalid(pointer, "A tool name is 1 to 128 printable characters, no whitespace.")
    return tool


def check_rule(rule: Any, pointer: str = "/rule") -> str:
    if rule not in RULES:
        raise _invalid(pointer, f"A rule is one of {', '.join(RULES)}.")
    return str(rule)


def check_patterns(patterns: Any, pointer: str = "/patterns") -> list[dict[str, str]]:
    """Argument patterns checked: a list of at most 20 ``{argument, matches, rule}``; the
    glob is fnmatch's, at most 200 characters. The gateway evaluates them in order."""
    if not isinstance(patterns, list):
        raise _invalid(pointer, "patterns must be a list.")
    if len(patterns) > MAX_PATTERNS:
        raise _invalid(pointer, f"At most {MAX_PATTERNS} patterns.")
    checked = []
    for n, pattern in enumerate(patterns):
        at = f"{pointer}/{n}"
        if not isinstance(pattern, dict) or set(pattern) != {"argument", "matches", "rule"}:
            raise _invalid(at, "A pattern is {argument, matches, rule}, nothing else.")
        argument, matches = pattern["argument"], pattern["matches"]
        if (
            not isinstance(argument, str)
            or not 1 <= len(argument) <= MAX_ARGUMENT
            or any(not c.isprintable() for c in argument)
        ):
            raise _invalid(f"{at}/argument", "An argument is 1 to 128 printable characters.")
        if not isinstance(matches, str) or not 1 <= len(matches) <= MAX_GLOB or "\x00" in matches:
            raise _invalid(f"{at}/matches", f"A glob is 1 to {MAX_GLOB} characters.")
        checked.append(
            {
                "argument": argument,
                "matches": matches,
                "rule": check_rule(pattern["rule"], f"{at}/rule"),
            }
        )
    return checked


def _check_tool(tool: Any, pointer: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise _invalid(pointer, "A tool is an object.")
    description = tool.get("description", "")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        raise _invalid(f"{pointer}/description", "A description is text of at most 2,000.")
    schema = tool.get("input_schema", {})
    if not isinstance(schema, dict) or too_deep(schema):
        raise _invalid(f"{pointer}/input_schema", "input_schema must be a JSON object.")
    if len(canonical_json(schema).encode()) > MAX_SCHEMA_BYTES:
        raise _invalid(f"{pointer}/input_schema", "input_schema is over 32 kB.")
    raw = tool.get("annotations")
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise _invalid(f"{pointer}/annotations", "annotations must be an object.")
    annotations: dict[str, Any] = {}
    for key, kind in ANNOTATIONS.items():
        if key not in raw or raw[key] is None:
            continue
        value: Any = raw[key]
        if not isinstance(value, kind) or (isinstance(value, str) and len(value) > MAX_TITLE):
            raise _invalid(f"{pointer}/annotations/{key}", f"{key} must be a {kind.__name__}.")
        annotations[key] = value
    return {
        "server": check_server(tool.get("server"), f"{pointer}/server"),
        "tool": check_tool_name(tool.get("name"), f"{pointer}/name"),
        "description": description,
        "input_schema": schema,
        "annotations": annotations,
    }


def _worker_may_serve(agent: str, serving: Serving) -> None:
    """The rule of a declaration (``runs.services.agent_declare``): only a token among the
    agent's owners, within its scope, reports its tools; an agent must be declared first."""
    declared = DeclaredAgent.objects.filter(name=agent).first()
    if declared is None:
        raise HoldpointError(
            "not_found",
            f"There is no declared agent named {agent[:100]!r}; declare it first "
            "(PUT /api/agents/{name}).",
        )
    why = serving.why_not(agent)
    if why is None and serving.token not in (declared.owners or []):
        holders = ", ".join(declared.owners or []) or "an administrator"
        why = f"Agent {agent!r} belongs to {holders}; worker token {serving.token!r} may not serve it."
    if why:
        raise HoldpointError("agent_not_yours", why, agent=agent)


def tool_rules_for(agent: str) -> list[ToolRule]:
    return list(ToolRule.objects.filter(agent=agent).select_related("confirmed_by"))


def tool_rules_read(*, agent: str, serving: Serving) -> list[ToolRule]:
    """The rules of ``agent``'s tools, for the gateway serving it."""
    _worker_may_serve(agent, serving)
    return tool_rules_for(agent)


@transaction.atomic(durable=True)
def tool_rules_report(*, agent: str, tools: Any, serving: Serving) -> list[ToolRule]:
    """Record the tools the gateway serving ``agent`` proxies now (at most 500): each row's
    description, schema, annotations and suggestion are updated, a person's rule and
    patterns kept; a tool missing from the list is kept and marked not offered now."""
    _worker_may_serve(agent, serving)
    if not isinstance(tools, list):
        raise _invalid("/tools", "tools must be a list.")
    if len(tools) > MAX_TOOLS:
        raise _invalid("/tools", f"At most {MAX_TOOLS} tools.")
    checked = [_check_tool(tool, f"/tools/{n}") for n, tool in enumerate(tools)]
    seen: set[tuple[str, str]] = set()
    for n, tool in enumerate(checked):
        key = (tool["server"], tool["tool"])
        if key in seen:
            raise _invalid(f"/tools/{n}", f"{key[0]}/{key[1]} is listed twice.")
        seen.add(key)
    # The agent's rows, locked in one order: a person's confirmation of one of them waits
    # for this report (and the other way round), so a confirmation always records the
    # hash of the tool as the person's page could have shown it, never half a report.
    existing = {
        (row.server, row.tool): row
        for row in ToolRule.objects.select_for_update().filter(agent=agent).order_by("id")
    }
    now = timezone.now()
    new_rows: list[ToolRule] = []
    changed: list[ToolRule] = []
    for tool in checked:
        fields = {
            "description": tool["description"],
            "input_schema": tool["input_schema"],
            "annotations": tool["annotations"],
            "suggested": suggest(tool["annotations"]),
            "reported_hash": tool_hash(
                description=tool["description"],
                input_schema=tool["input_schema"],
                annotations=tool["annotations"],
            ),
            "offered": True,
        }
        row = existing.get((tool["server"], tool["tool"]))
        if row is None:
            new_rows.append(
                ToolRule(agent=agent, server=tool["server"], tool=tool["tool"], **fields)
            )
        elif any(getattr(row, name) != value for name, value in fields.items()):
            # Only what the report changes is written (a gateway reports at each start).
            for name, value in fields.items():
                setattr(row, name, value)
            row.updated_at = now
            changed.append(row)
    if new_rows:
        # Two first reports at once: the second waits on the unique index and then updates
        # the row the first made (no IntegrityError, no second row).
        ToolRule.objects.bulk_create(
            new_rows,
            update_conflicts=True,
            unique_fields=["agent", "server", "tool"],
            update_fields=[*REPORTED_FIELDS, "updated_at"],
        )
    if changed:
        ToolRule.objects.bulk_update(changed, [*REPORTED_FIELDS, "updated_at"])
    gone = [row.pk for key, row in existing.items() if key not in seen and row.offered]
    ToolRule.objects.filter(pk__in=gone).update(offered=False, updated_at=now)
    return tool_rules_for(agent)


def _comment(comment: Any) -> str:
    if not isinstance(comment, str) or len(comment) > MAX_DESCRIPTION:
        raise _invalid("/comment", "A comment is text of at most 2,000 characters.")
    return comment.strip()


def _rule_row(agent: str, server: str, tool: str) -> ToolRule:
    row = (
        ToolRule.objects.select_for_update()
        .filter(agent=agent[:100], server=server[:64], tool=tool[:MAX_TOOL_NAME])
        .first()
    )
    if row is None:
        raise HoldpointError(
            "not_found",
            f"Agent {agent[:100]!r} has no tool {server[:64]}/{tool[:MAX_TOOL_NAME]} reported "
            "by its MCP gateway.",
        )
    return row


def _confirm(
    row: ToolRule,
    *,
    rule: str,
    patterns: list[dict[str, str]],
    user: UserLike,
    actor: str,
    door: dict[str, str],
    comment: str,
) -> ToolRule:
    before = row.rule
    row.rule = rule
    row.patterns = patterns
    row.confirmed_by = user_or_none(user)
    row.confirmed_actor = actor[:200]
    row.confirmed_at = timezone.now()
    row.confirmed_hash = row.reported_hash
    row.save()
    append_agent_event(
        agent=row.agent,
        type=TOOL_RULE_CONFIRMED,
        actor=actor,
        payload={
            "server": row.server,
            "tool": row.tool,
            "rule": rule,
            "patterns": patterns,
            "pattern_count": len(patterns),
            # Only when there was one: a JSON null reads as "null" on SQLite's side of KT.
            **({"from": before} if before else {}),
            "suggested": row.suggested,
            "accepted_suggestion": rule == row.suggested and not patterns,
            "confirmed_hash": row.confirmed_hash,
            **({"comment": comment} if comment else {}),
            **door,
        },
    )
    return row


@transaction.atomic(durable=True)
def tool_rule_confirm(
    *,
    agent: str,
    server: str,
    tool: str,
    rule: Any,
    patterns: Any = (),
    seen_hash: str | None = None,
    comment: str = "",
    user: UserLike = None,
    actor: str | None = None,
    via: str = "",
    identity: str = "",
) -> ToolRule:
    """A person sets the rule of ``agent``'s tool ``server``/``tool`` and its argument
    patterns: the rule in force from now on, against the tool as last reported.
    ``seen_hash``: the tool's hash as the person's page showed it; when the gateway
    reported something else since, nothing changes (``invalid_state``)."""
    door = how(via=via, identity=identity)
    comment = _comment(comment)
    checked_rule = check_rule(rule)
    checked = check_patterns(list(patterns) if isinstance(patterns, tuple) else patterns)
    # The row lock orders this after a report or another confirmation of the same tool.
    row = _rule_row(agent, server, tool)
    if seen_hash is not None and seen_hash != row.reported_hash:
        raise HoldpointError(
            "invalid_state",
            "The tool changed since this page was shown; look at it again before confirming.",
            changed=True,
        )
    return _confirm(
        row,
        rule=checked_rule,
        patterns=checked,
        user=user,
        actor=actor or actor_for(user),
        door=door,
        comment=comment,
    )


@transaction.atomic(durable=True)
def tool_rules_confirm_suggested(
    *,
    agent: str,
    comment: str = "",
    user: UserLike = None,
    actor: str | None = None,
    via: str = "",
    identity: str = "",
) -> list[ToolRule]:
    """A person accepts the suggestion of every tool of ``agent`` nobody has confirmed;
    return the rows confirmed now (a tool someone confirms meanwhile keeps that rule)."""
    door = how(via=via, identity=identity)
    comment = _comment(comment)
    actor = actor or actor_for(user)
    # Locked with the condition: on PostgreSQL a row that another person confirmed while
    # this waited for its lock is read again and left out, so a suggestion never
    # overwrites a person's choice made a moment earlier.
    rows = list(
        ToolRule.objects.select_for_update()
        .filter(agent=agent[:100], rule__isnull=True)
        .order_by("id")
    )
    return [
        _confirm(
            row,
            rule=row.suggested,
            patterns=[],
            user=user,
            actor=actor,
            door=door,
            comment=comment,
        )
        for row in rows
        if row.rule is None
    ]
