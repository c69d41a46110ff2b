"""Issue 19, point 6: the approval an irreversible side effect asks for can be shaped
(``approval={"prompt", "expires_in", "context"}``), and the documented pattern undoes a
step's earlier effects when it is denied."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from ledger.tools import register_tool, unregister_tool
from runs import services
from runtime.executor import Outcome
from runtime.questions import approval_options
from runtime.sdk import ApprovalDenied
from runtime.testing import FakeTool, run_agent
from tests.runtime.conftest import fresh, run_next


@pytest.fixture
def launcher() -> Iterator[FakeTool]:
    tool = FakeTool("launcher", reversibility="irreversible")
    register_tool(tool)
    yield tool
    unregister_tool("launcher")


@pytest.mark.django_db
def test_the_automatic_approval_takes_the_agents_prompt_expiry_and_context(
    make_agent: Any, launcher: FakeTool
) -> None:
    agent = make_agent()

    @agent.step
    def launch(ctx: Any, state: Any) -> Any:
        done = ctx.side_effect(
            "launcher",
            "prod",
            {"go": True},
            approval={
                "prompt": "Launch the v2 rollout in prod?",
                "expires_in": 600,
                "context": {"ticket": "OPS-12", "canary": "green"},
            },
        )
        return ctx.done(done.external_reference)

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.INTERRUPTED
    request = fresh(run).pending_request
    assert request.kind == "auth_required" and request.step_id == "launch.launcher"
    assert request.prompt == "Launch the v2 rollout in prod?"
    assert request.context["ticket"] == "OPS-12" and request.context["canary"] == "green"
    lasts = request.expires_at - request.created_at
    assert dt.timedelta(seconds=590) <= lasts <= dt.timedelta(seconds=610)
    assert request.action["change"] == {"go": True}  # the approval still covers the call
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=request.checkpoint_id,
        value={"decision": "approve"},
    )
    assert run_next(agent) == Outcome.SUCCEEDED
    assert len(launcher.performed) == 1


def test_approval_options_are_checked() -> None:
    assert approval_options(None) == {}
    with pytest.raises(TypeError, match="not comment"):
        approval_options({"prompt": "Go?", "comment": "x"})
    with pytest.raises(TypeError, match="non-empty"):
        approval_options({"prompt": " "})
    with pytest.raises(TypeError, match="context is a dict"):
        approval_options({"context": ["x"]})


def test_the_compensate_on_deny_pattern_undoes_the_steps_earlier_effect(make_agent: Any) -> None:
    agent = make_agent()

    # The pattern of docs/agents.md ("When an approval is denied").
    @agent.step
    def release(ctx: Any, state: Any) -> Any:
        flag = ctx.side_effect(
            "config_store",
            "flags/checkout",
            {"document": "flags/checkout", "content": {"v2": True}},
        )
        try:
            ctx.side_effect(
                "email",
                "customers",
                {"to": "customers@example.com", "subject": "The new checkout is live"},
                approval={
                    "prompt": "Announce the new checkout to every customer?",
                    "context": {"flag": flag.external_reference},
                },
            )
        except ApprovalDenied as denied:
            ctx.side_effect(
                "config_store",
                "flags/checkout",
                {"document": "flags/checkout", "content": {"v2": False}},
                key="undo-flag",
            )
            return ctx.done({"released": False, "why": denied.approval.comment})
        return ctx.done({"released": True})

    store = FakeTool("config_store")
    run = run_agent(
        agent,
        approvals=[{"decision": "deny", "comment": "not before Monday"}],
        tools={"config_store": store},
    )
    assert run.status == "succeeded", run.error
    assert run.result == {"released": False, "why": "not before Monday"}
    assert run.questions[0].prompt == "Announce the new checkout to every customer?"
    assert run.questions[0].context["flag"] == "config_store-1"
    assert [request["content"] for request, _ in store.calls] == [{"v2": True}, {"v2": False}]
    assert run.tools["email"].calls == []
    assert run.side_effects["release.config_store"].decisions == ["act", "reuse"]
