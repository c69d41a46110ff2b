"""The Python agents this process can run, by name.

Agent modules are listed in ``settings.HOLDPOINT_AGENT_MODULES`` and imported when
Django starts (``RuntimeConfig.ready``). An agent is the agent SDK's one class
(``holdpoint_client.Agent``); ``runtime.sdk.Agent`` registers itself here when it is
created, and a plain ``holdpoint_client.Agent`` found in an agent module (written only
against the client package, the same object ``holdpoint-worker`` serves and the harness
runs) is registered when its module is loaded, its own tools with the ledger. Each is
registered with the run store too (``runs.agents.register_agent_spec``), so ``run_start``
accepts it. Workers claim only the agents registered here: agents declared for HTTP
workers in other languages are left to those workers.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from holdpoint_client.agent import Agent
from holdpoint_client.tools import Tool

from runs.agents import (
    AgentSpec,
    label_template_problem,
    register_agent_spec,
    unregister_agent_spec,
)
from runs.approvals import parse_policy

logger = logging.getLogger(__name__)

_agents: dict[str, Agent] = {}
# The tools an agent found in a module brought with it (registered with the ledger).
_adopted_tools: dict[str, list[Tool]] = {}


def checked_policy(policy: Any) -> dict[str, Any]:
    """An agent's approval policy checked: who may decide and how many (the fields of
    ``runs.approvals.parse_policy``) and ``ask_before``, the tools whose every call asks a
    person first (the runtime asks). A mistake is a ``ValueError``."""
    if not policy:
        return {}
    if not isinstance(policy, dict):
        raise ValueError("approval_policy is a dict")
    checked = parse_policy({k: v for k, v in policy.items() if k != "ask_before"})
    ask = policy.get("ask_before", [])
    if not isinstance(ask, list | tuple) or not all(isinstance(n, str) and n for n in ask):
        raise ValueError("approval_policy's ask_before is a list of tool names")
    if ask:
        checked["ask_before"] = list(dict.fromkeys(ask))
    return checked


def agent_spec(agent: Agent) -> AgentSpec:
    """What the run store knows of an agent this process runs; a label or approval policy
    it cannot take is a ``ValueError``."""
    problem = label_template_problem(agent.label) if agent.label else None
    if problem:
        raise ValueError(f"The label {agent.label!r} is not valid: {problem}.")
    policy = checked_policy(agent.approval_policy)
    return AgentSpec(
        name=agent.name,
        input_schema=agent.input_schema,
        retry_policy=agent.retry,
        tools=agent.tool_names,
        description=agent.description,
        source="python",
        label=agent.label,
        step_retry={
            name: options.retry
            for name, options in agent.step_options.items()
            if options.retry is not None
        },
        # ``ask_before`` is the runtime's business, not who may decide.
        approval_policy={k: v for k, v in policy.items() if k != "ask_before"},
    )


def register(agent: Agent) -> None:
    spec = agent_spec(agent)
    existing = _agents.get(agent.name)
    if existing is not None and existing is not agent:
        logger.warning("agent %r registered again; the newer definition wins", agent.name)
    _agents[agent.name] = agent
    register_agent_spec(spec)


def unregister(name: str) -> None:
    from ledger.tools import registered_tools, unregister_tool

    _agents.pop(name, None)
    unregister_agent_spec(name)
    current = {tool.name: tool for tool in registered_tools()}
    for own in _adopted_tools.pop(name, []):
        if current.get(own.name) is own:
            unregister_tool(own.name)


def get_agent(name: str) -> Agent | None:
    return _agents.get(name)


def agent_names() -> list[str]:
    return sorted(_agents)


def agents_in(module: ModuleType) -> list[Agent]:
    """The agents a module holds at its top level, alone or in a list (as
    ``holdpoint-worker module:agents`` takes them)."""
    found: dict[int, Agent] = {}
    for value in vars(module).values():
        values = value if isinstance(value, list | tuple) else [value]
        for item in values:
            if isinstance(item, Agent):
                found.setdefault(id(item), item)
    return list(found.values())


def adopt(agent: Agent, where: str = "") -> None:
    """Run a plain ``holdpoint_client.Agent`` in this process: its own tools are registered
    with the ledger (as an app registers a tool), then the agent. A tool that would replace
    another of that name (a shipped one) is refused: ``ImproperlyConfigured``."""
    from ledger.tools import register_tool, registered_tools

    current = {tool.name: tool for tool in registered_tools()}
    own = agent.own_tools()
    for tool in own:
        there = current.get(tool.name)
        if there is not None and there is not tool and type(there) is not type(tool):
            raise ImproperlyConfigured(
                f"Agent {agent.name!r}{where} brings a tool named {tool.name!r}, and the "
                f"server has another tool of that name ({type(there).__name__}); name it "
                "differently."
            )
    try:
        register(agent)
    except ValueError as exc:
        raise ImproperlyConfigured(f"Agent {agent.name!r}{where}: {exc}") from exc
    for tool in own:
        register_tool(tool)
    _adopted_tools[agent.name] = own


def load_agent_modules(modules: list[str] | None = None) -> None:
    """Import every module named in ``HOLDPOINT_AGENT_MODULES`` (or ``modules``), and
    register the plain ``holdpoint_client.Agent`` objects each holds."""
    for name in settings.HOLDPOINT_AGENT_MODULES if modules is None else modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"HOLDPOINT_AGENT_MODULES names {name!r}, which cannot be imported: {exc}. "
                "List importable modules that define agents, separated by commas."
            ) from exc
        for agent in agents_in(module):
            registered = _agents.get(agent.name)
            if registered is agent:
                continue  # A ``runtime.sdk.Agent``: it registered itself.
            if registered is not None:
                logger.warning(
                    "agent %r in %s is not run here: another agent of that name is",
                    agent.name,
                    name,
                )
                continue
            adopt(agent, f" (in {name})")
