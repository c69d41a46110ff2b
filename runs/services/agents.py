"""Agents declared over the worker API (``PUT /api/agents/{name}``), versioned.

A declaration names the agent's input schema, label template, retry policy, approval
policy and tools (each with its reversibility). The first declaration is version 1. A
declaration whose input schema differs (as canonical JSON) from the current version's
makes the next version; any other change updates the current version in place. A run
records the version it started with (``Run.agent_version``), so a change of schema never
changes what an existing run was validated against (docs/protocol.md, "Declaring an agent").
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from runs.agents import (
    RetryPolicy,
    forget_declared_labels,
    label_template_problem,
    python_agent_specs,
)
from runs.approvals import parse_policy
from runs.errors import HoldpointError
from runs.models import AgentVersion, DeclaredAgent
from runs.schemas import canonical_json, compile_schema, too_deep
from runs.tokens import Serving

logger = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[-a-zA-Z0-9_]{1,100}$")
REVERSIBILITIES = ("reversible", "compensable", "irreversible")
MAX_TOOLS = 50
MAX_DESCRIPTION = 2000
MAX_LABEL = 200
MAX_SCHEMA_BYTES = 64_000
APPROVAL_POLICY_KEYS = ("ask_before",)


@dataclass(frozen=True)
class Declared:
    agent: DeclaredAgent
    created: bool
    new_version: bool


def _invalid(pointer: str, message: str) -> HoldpointError:
    return HoldpointError(
        "invalid_input", message, errors=[{"pointer": pointer, "message": message}]
    )


def _tools(tools: Any) -> list[dict[str, str]]:
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise _invalid("/tools", f"tools must be a list of at most {MAX_TOOLS} tools.")
    seen: dict[str, dict[str, str]] = {}
    for index, tool in enumerate(tools):
        if isinstance(tool, str):
            tool = {"name": tool}
        if not isinstance(tool, dict) or set(tool) - {"name", "reversibility", "description"}:
            raise _invalid(
                f"/tools/{index}", "a tool is {name, reversibility?, description?} or a name."
            )
        name = tool.get("name")
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise _invalid(
                f"/tools/{index}/name", "a tool name is 1 to 100 letters, digits, - or _."
            )
        reversibility = tool.get("reversibility", "irreversible")
        if reversibility not in REVERSIBILITIES:
            raise _invalid(
                f"/tools/{index}/reversibility",
                f"reversibility must be one of {', '.join(REVERSIBILITIES)}.",
            )
        description = tool.get("description", "")
        if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
            raise _invalid(f"/tools/{index}/description", "at most 2,000 characters.")
        seen[name] = {"name": name, "reversibility": reversibility, "description": description}
    return list(seen.values())


def _approval_policy(policy: Any, tools: list[dict[str, str]]) -> dict[str, Any]:
    """What the agent declares about approvals: ``ask_before`` (tools whose every call asks
    a person first; the client asks) and who may decide and how many (the fields of
    ``runs.approvals.parse_policy``: groups, required, self_approval, any_deny_closes,
    escalation, remind, rules), the same policy a Python agent gives with
    ``approval_policy=``."""
    if policy is None:
        return {}
    if not isinstance(policy, dict):
        raise _invalid("/approval_policy", "approval_policy is a JSON object.")
    team = {k: v for k, v in policy.items() if k not in APPROVAL_POLICY_KEYS}
    try:
        checked = parse_policy(team)
    except ValueError as exc:
        raise _invalid("/approval_policy", f"The approval policy is not valid: {exc}.") from None
    ask = policy.get("ask_before", [])
    names = {t["name"] for t in tools}
    if (
        not isinstance(ask, list)
        or len(ask) > MAX_TOOLS
        or not all(isinstance(n, str) and NAME_RE.match(n) for n in ask)
    ):
        raise _invalid("/approval_policy/ask_before", "a list of tool names.")
    unknown = sorted(set(ask) - names - {"webhook", "email", "config_store"})
    if unknown:
        raise _invalid(
            "/approval_policy/ask_before",
            f"{', '.join(unknown)}: not among the agent's tools.",
        )
    if ask:
        checked["ask_before"] = list(dict.fromkeys(ask))
    return checked


@transaction.atomic(durable=True)
def agent_declare(
    *,
    name: str,
    actor: str,
    input_schema: Any = None,
    retry_policy: Any = None,
    label: str = "",
    description: str = "",
    tools: Any = None,
    approval_policy: Any = None,
    serving: Serving | None = None,
    owners: list[str] | None = None,
) -> Declared:
    """Create or update the declaration of agent ``name``; a new input schema makes a new version.

    ``serving`` is what the declaring worker token may serve (``runs.tokens.serving_for``;
    None: an administrator). The first declaration by a token makes it the agent's owner;
    a token outside its scope or not among the owners is refused ``agent_not_yours``. An
    administrator declaring a new agent may name its ``owners`` (token names) at once, so
    that the token of the worker that will serve it may declare it too.
    Declarations of the same new agent at once make one version: the first creates the
    row, the others wait for it and update it."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise HoldpointError(
            "invalid_input", "An agent name is 1 to 100 letters, digits, - or _.", agent=name
        )
    schema = input_schema if input_schema is not None else {}
    if not isinstance(schema, dict) or too_deep(schema):
        raise _invalid("/input_schema", "input_schema must be a JSON object.")
    if len(canonical_json(schema)) > MAX_SCHEMA_BYTES:
        raise _invalid("/input_schema", "input_schema is larger than 64 kB.")
    if schema:
        try:
            compile_schema(schema)
        except HoldpointError as exc:
            raise _invalid("/input_schema", exc.detail) from None
    policy = retry_policy if retry_policy is not None else {}
    if not isinstance(policy, dict):
        raise _invalid("/retry_policy", "retry_policy must be a JSON object.")
    try:
        policy = RetryPolicy.from_dict(policy).as_dict() if policy else {}
    except (TypeError, ValueError) as exc:
        raise _invalid("/retry_policy", f"The retry policy is not valid: {exc}.") from None
    if not isinstance(label, str) or len(label) > MAX_LABEL:
        raise _invalid("/label", "label must be at most 200 characters.")
    label_problem = label_template_problem(label)
    if label_problem:
        raise _invalid("/label", f"The label is not valid: {label_problem}.")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        raise _invalid("/description", "description must be at most 2,000 characters.")
    declared_tools = _tools(tools if tools is not None else [])
    approvals = _approval_policy(approval_policy, declared_tools)
    if any(spec.name == name for spec in python_agent_specs()):
        raise HoldpointError(
            "invalid_state",
            f"A Python agent named {name!r} runs in the server; a declaration would never "
            "be used. Give the remote agent another name.",
            agent=name,
        )
    values = {
        "retry_policy": policy,
        "label": label,
        "approval_policy": approvals,
        "tool_declarations": declared_tools,
        "description": description,
        "declared_by": actor[:200],
    }

    if serving is not None:
        scoped_out = serving.why_not(name) if serving.allowed is not None else None
        if scoped_out:
            raise HoldpointError("agent_not_yours", scoped_out, agent=name, reason="not_in_scope")
    # The row is the lock of the declaration. A new agent has no row to lock yet: insert it
    # first (in a savepoint), so that two first declarations at once take turns on it
    # instead of both creating version 1 (an IntegrityError, a 500).
    created = False
    if not DeclaredAgent.objects.filter(name=name).exists():
        try:
            with transaction.atomic():
                DeclaredAgent.objects.create(
                    name=name,
                    version=1,
                    declared_by=actor[:200],
                    owners=[serving.token] if serving is not None else list(owners or []),
                )
            created = True
        except IntegrityError:
            pass  # declared meanwhile: locked and updated below
    agent = DeclaredAgent.objects.select_for_update().get(name=name)
    if serving is not None and not created and serving.token not in (agent.owners or []):
        holders = ", ".join(agent.owners or []) or "an administrator"
        raise HoldpointError(
            "agent_not_yours",
            f"Agent {name!r} belongs to {holders}; worker token {serving.token!r} may not "
            f"declare it. An administrator can add it to the agent's owners "
            f"(manage.py agent owners {name} --add {serving.token}).",
            agent=name,
            reason="owned_by_others",
        )
    current = AgentVersion.objects.filter(agent=name, version=agent.version).first()
    # A new input schema is a new version; the first declaration (or one made by the
    # management command, which keeps no versions) writes the current version's row.
    new_version = current is not None and canonical_json(current.input_schema) != canonical_json(
        schema
    )
    if new_version:
        agent.version += 1
    if current is None or new_version:
        AgentVersion.objects.create(
            agent=name, version=agent.version, input_schema=schema, **values
        )
    else:
        AgentVersion.objects.filter(pk=current.pk).update(**values)
    agent.input_schema = schema
    agent.retry_policy = policy
    agent.label = label
    agent.description = description
    agent.approval_policy = approvals
    agent.tool_declarations = declared_tools
    agent.tools = [t["name"] for t in declared_tools]
    agent.declared_by = actor[:200]
    agent.save()
    # Now (this thread reads its own write) and at commit (every reader sees it).
    forget_declared_labels()
    transaction.on_commit(forget_declared_labels)
    return Declared(agent=agent, created=created, new_version=new_version)


def declared_tool_of(agent: str, name: str) -> dict[str, str] | None:
    """The declaration of tool ``name`` by agent ``agent`` itself (a tool that runs in that
    agent's process), or None. Another agent's declaration of the same name is never it.
    An agent of this process's Python registry declares nothing (it wins over a
    declaration of the same name, as in ``runs.agents.agent_spec``)."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        return None
    if any(spec.name == agent for spec in python_agent_specs()):
        return None
    tools = DeclaredAgent.objects.filter(name=agent).values_list("tool_declarations", flat=True)
    for tool in next(iter(tools), None) or []:
        if isinstance(tool, dict) and tool.get("name") == name:
            return tool
    return None


def agents_declaring_tool(name: str) -> list[str]:
    """The declared agents whose own processes run the tool ``name`` (their workers act
    and look up; the server never does), whatever this process registers under that
    name. An agent of this process's Python registry is not one of them: it wins over a
    declaration of the same name, as in ``runs.agents.agent_spec``."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        return []
    python = {spec.name for spec in python_agent_specs()}
    # Few rows, and JSON containment is PostgreSQL's only: filter here (SQLite too).
    declared = DeclaredAgent.objects.values_list("name", "tool_declarations")
    return sorted(
        agent
        for agent, tools in declared
        if agent not in python
        and any(isinstance(t, dict) and t.get("name") == name for t in tools or [])
    )


@transaction.atomic(durable=True)
def agent_owners_set(
    *,
    name: str,
    add: Iterable[str] = (),
    remove: Iterable[str] = (),
    actor: str,
) -> list[str]:
    """Change which worker tokens (by name) declared agent ``name`` belongs to; return its
    owners. An administrator's move: a token among them may declare the agent and claim
    its runs, any other is refused ``agent_not_yours``."""
    agent = DeclaredAgent.objects.select_for_update().filter(name=name).first()
    if agent is None:
        raise HoldpointError("unknown_agent", f"There is no declared agent named {name!r}.")
    add, remove = list(add), set(remove)
    bad = [t for t in add if not NAME_RE.match(t)]
    if bad:
        raise HoldpointError("invalid_input", f"Not worker token names: {', '.join(bad)}.")
    owners = [t for t in (agent.owners or []) if t not in remove]
    owners += [t for t in add if t not in owners]
    agent.owners = owners
    agent.save(update_fields=["owners", "updated_at"])
    # No run changed, so no run event: the audit line is the log's.
    logger.info("agent %s now belongs to %s (set by %s)", name, owners or "no token", actor)
    return owners
