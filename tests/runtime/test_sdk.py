"""Registering agents: the runtime's registry, the run store's, and the settings hook."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from runs import services
from runs.agents import agent_spec
from runs.errors import HoldpointError
from runtime.registry import agent_names, get_agent, load_agent_modules
from runtime.sdk import Agent, RetryPolicy


@pytest.mark.django_db
def test_an_agent_is_registered_with_the_runtime_and_the_run_store(make_agent) -> None:
    policy = RetryPolicy(max_attempts=2, non_retryable=("KeyError",), cost_budget=5.0)
    agent = make_agent(
        input_schema={"service": "string"}, retry=policy, description="d", tools=["email"]
    )
    assert get_agent(agent.name) is agent
    assert agent.name in agent_names()
    spec = agent_spec(agent.name)
    assert (spec.retry_policy, spec.tools, spec.description, spec.source) == (
        policy,
        ("email",),
        "d",
        "python",
    )
    agent.unregister()
    assert get_agent(agent.name) is None
    with pytest.raises(HoldpointError) as exc:
        agent_spec(agent.name)
    assert exc.value.code == "unknown_agent"


@pytest.mark.django_db
def test_run_start_checks_input_against_the_agent_s_schema(make_agent) -> None:
    agent = make_agent(input_schema={"service": "string"})
    with pytest.raises(HoldpointError) as exc:
        services.run_start(agent=agent.name, input={"service": 3})
    assert exc.value.code == "invalid_input"
    assert services.run_start(agent=agent.name, input={"service": "api"}).agent == agent.name


def test_steps_register_by_name_and_the_first_one_starts(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def plain(ctx, state):
        return ctx.done()

    @agent.step("named")
    def other(ctx, state):
        return ctx.done()

    assert list(agent.steps) == ["plain", "named"]
    assert agent.start == "plain"

    @agent.step("entry", start=True)
    def entry(ctx, state):
        return ctx.done()

    assert agent.start == "entry"
    with pytest.raises(ValueError, match="already has a step named 'plain'"):
        agent.step("plain")(lambda ctx, state: None)


def test_a_name_is_required() -> None:
    with pytest.raises(ValueError, match="1 to 100 characters"):
        Agent(name="")


def test_the_demo_agents_come_from_the_setting() -> None:
    assert {"flaky-deploy"} <= set(agent_names())


def test_an_agent_module_that_cannot_be_imported_stops_start_up() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"HOLDPOINT_AGENT_MODULES names 'no\.such'"):
        load_agent_modules(["no.such"])
