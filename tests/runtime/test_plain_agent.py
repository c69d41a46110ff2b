"""An agent written only against the client package runs in the server's process by how it
is started (issue 26): ``runagents`` loads the modules of ``HOLDPOINT_AGENT_MODULES`` and
runs the plain ``holdpoint_client.Agent`` it finds there, its own tools with the ledger and
its ``ask_before`` honoured, as ``holdpoint-worker`` (tests/clients/test_plain_agent.py)
and the harness run the very same object."""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from holdpoint_client import Agent as SdkAgent
from holdpoint_client.testing import run_agent

from ledger.models import SideEffect
from ledger.tools import get_tool
from runs import services
from runs.errors import HoldpointError
from runtime import registry
from runtime.executor import Outcome
from runtime.worker import WorkerPool
from tests.runtime import plain_agent
from tests.runtime.conftest import fresh, run_next

pytestmark = pytest.mark.django_db

MODULE = "tests.runtime.plain_agent"


@pytest.fixture
def loaded() -> Iterator[SdkAgent]:
    plain_agent.tickets.tickets.clear()
    registry.load_agent_modules([MODULE])
    yield plain_agent.agent
    registry.unregister(plain_agent.agent.name)


def answer(run: Any, value: Any) -> str:
    request = fresh(run).pending_request
    services.run_resume(
        run_id=run.id, request_id=request.id, checkpoint_id=request.checkpoint_id, value=value
    )
    return str(request.kind)


def test_runagents_runs_a_plain_client_agent_found_in_an_agent_module(loaded) -> None:
    assert registry.get_agent("plain-deploy") is plain_agent.agent
    assert get_tool("plain-ticket") is plain_agent.tickets  # its own tool, with the ledger
    assert WorkerPool(1, ["plain-deploy"]).agents == ["plain-deploy"]
    with pytest.raises(HoldpointError) as refused:  # its input schema, at run_start
        services.run_start(agent="plain-deploy", input={"service": 7})
    assert refused.value.code == "invalid_input"

    run = services.run_start(agent="plain-deploy", input={"service": "gateway"})
    assert fresh(run).label == "Deploy gateway"
    assert run_next(loaded) == Outcome.INTERRUPTED
    assert answer(run, {"versions": ["v2"]}) == "input_required"
    assert run_next(loaded) == Outcome.INTERRUPTED  # ask_before: the ticket asks first
    request = fresh(run).pending_request
    assert (request.kind, request.step_id) == ("auth_required", "apply.plain-ticket.approve")
    assert answer(run, {"decision": "approve"}) == "auth_required"
    assert run_next(loaded) == Outcome.SUCCEEDED

    assert fresh(run).result == {"ticket": "T-1", "versions": ["v2"]}
    effect = SideEffect.objects.get(run_id=run.id)
    assert (effect.tool, effect.status, effect.external_reference) == (
        "plain-ticket",
        "confirmed",
        "T-1",
    )
    assert plain_agent.tickets.executed == 1


def test_the_harness_runs_the_same_object_the_same_way() -> None:
    plain_agent.tickets.tickets.clear()
    run = run_agent(
        plain_agent.agent,
        {"service": "gateway"},
        answers=[{"versions": ["v2"]}],
        approvals=["approve"],
        tools={"plain-ticket": plain_agent.tickets},
    )
    assert run.status == "succeeded", run.error
    assert run.result == {"ticket": "T-1", "versions": ["v2"]}
    assert [(q.kind, q.key) for q in run.questions] == [
        ("input_required", "plan.ask"),
        ("auth_required", "apply.plain-ticket.approve"),
    ]


def test_a_plain_agent_may_not_replace_a_tool_of_the_server(monkeypatch) -> None:
    class Mailer:
        name = "email"  # the server's own e-mail tool
        reversibility = "reversible"

        def execute(self, request: Any, idempotency_key: str) -> Any:
            raise AssertionError("never runs")

        def lookup(self, idempotency_key: str) -> Any:
            return None

    module = types.ModuleType("plain_mailer")
    module.agent = SdkAgent(name="plain-mailer", tools=[Mailer()])  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "plain_mailer", module)
    with pytest.raises(ImproperlyConfigured, match="'email'"):
        registry.load_agent_modules(["plain_mailer"])
    assert registry.get_agent("plain-mailer") is None
    assert type(get_tool("email")).__name__ != "Mailer"
