"""The Python agents this process can run, by name.

Agent modules are listed in ``settings.HOLDPOINT_AGENT_MODULES`` and imported when
Django starts (``RuntimeConfig.ready``); creating an ``Agent`` registers it here and
in the run store (``runs.agents.register_agent_spec``), so ``run_start`` accepts it.
Workers claim only the agents registered here: agents declared for HTTP workers in
other languages are left to those workers.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runs.agents import AgentSpec, RetryPolicy, register_agent_spec, unregister_agent_spec


class Agent(Protocol):
    """What the registry and the executor need of an agent; ``runtime/agent.py`` defines
    the one authors use. The registry imports nothing of it: an agent registers itself."""

    @property
    def name(self) -> str: ...
    @property
    def retry(self) -> RetryPolicy: ...
    @property
    def start(self) -> str | None: ...
    @property
    def steps(self) -> Mapping[str, Callable[..., Any]]: ...
    @property
    def spec(self) -> AgentSpec: ...


logger = logging.getLogger(__name__)

_agents: dict[str, Agent] = {}


def register(agent: Agent) -> None:
    existing = _agents.get(agent.name)
    if existing is not None and existing is not agent:
        logger.warning("agent %r registered again; the newer definition wins", agent.name)
    _agents[agent.name] = agent
    register_agent_spec(agent.spec)


def unregister(name: str) -> None:
    _agents.pop(name, None)
    unregister_agent_spec(name)


def get_agent(name: str) -> Agent | None:
    return _agents.get(name)


def agent_names() -> list[str]:
    return sorted(_agents)


def load_agent_modules(modules: list[str] | None = None) -> None:
    """Import every module named in ``HOLDPOINT_AGENT_MODULES`` (or ``modules``)."""
    for module in settings.HOLDPOINT_AGENT_MODULES if modules is None else modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"HOLDPOINT_AGENT_MODULES names {module!r}, which cannot be imported: {exc}. "
                "List importable modules that define agents, separated by commas."
            ) from exc
