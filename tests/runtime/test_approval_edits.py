"""The SDK's side of team approvals (issue 18): ``ctx.approve(editable=...)`` and
``approval.edited`` / ``approval.responded``; an irreversible call approved with edits
executes the edited request, under its own key; ``Agent(approval_policy=...)``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.tools import register_tool, unregister_tool
from runs import services
from runs.models import InputRequest
from runtime.executor import Outcome as Ended
from runtime.sdk import ApprovalDenied
from tests.runtime.conftest import fresh, run_next
from tests.runtime.test_side_effects import CountingTool

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "properties": {"to": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
    "required": ["to"],
}


class EditableTool(CountingTool):
    request_schema = SCHEMA
    edit_schema = SCHEMA


@pytest.fixture
def mailer() -> Iterator[EditableTool]:
    tool = register_tool(EditableTool("mailer", "irreversible"))
    yield tool  # type: ignore[misc]
    unregister_tool("mailer")


def answer(run: Any, value: Any) -> InputRequest:
    request = fresh(run).pending_request
    services.run_resume(
        run_id=run.id, request_id=request.id, checkpoint_id=request.checkpoint_id, value=value
    )
    return request


def test_ctx_approve_with_editable_returns_the_edit(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def plan(ctx, state):
        approval = ctx.approve(
            "resize",
            "pool-a",
            {"size": {"from": 3, "to": 5}},
            editable={"size": "integer"},
            arguments={"size": 5},
        )
        return ctx.done(
            {"approved": approval.approved, "edited": approval.edited, "by": approval.answered_by}
        )

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Ended.INTERRUPTED
    request = fresh(run).pending_request
    assert request.action["editable"]["value"] == {"size": 5}
    assert request.action["editable"]["schema"]["properties"]["size"] == {"type": "integer"}
    answer(run, {"decision": "approve", "edited": {"size": 4}})
    assert run_next(agent) == Ended.SUCCEEDED
    assert fresh(run).result == {"approved": True, "edited": {"size": 4}, "by": None}


def test_a_response_goes_back_to_the_step_with_its_comment(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def plan(ctx, state):
        approval = ctx.approve("resize", "pool-a", {"size": {"from": 3, "to": 5}})
        return ctx.done(
            {
                "responded": approval.responded,
                "approved": approval.approved,
                "comment": approval.comment,
            }
        )

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    answer(run, {"decision": "respond", "comment": "5 is too many; try 4"})
    assert run_next(agent) == Ended.SUCCEEDED
    assert fresh(run).result == {
        "responded": True,
        "approved": False,
        "comment": "5 is too many; try 4",
    }


def test_an_irreversible_call_approved_with_edits_runs_the_edit_under_its_own_key(
    make_agent, mailer
) -> None:
    sent_with_edits(make_agent, mailer)


def sent_with_edits(make_agent: Any, mailer: EditableTool) -> Any:
    agent = make_agent()

    @agent.step
    def send(ctx, state):
        sent = ctx.side_effect("mailer", "ops", {"to": ["all@example.com"]})
        return ctx.done(sent.result["echo"])

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Ended.INTERRUPTED
    request = fresh(run).pending_request
    # The tool says its request's shape: the approver may edit it. The server adds the
    # tool's request schema, which an edit must fit too.
    assert request.action["editable"] == {
        "schema": SCHEMA,
        "value": {"to": ["all@example.com"]},
        "request_schema": SCHEMA,
    }
    answer(run, {"decision": "approve", "edited": {"to": ["oncall@example.com"]}})
    assert run_next(agent) == Ended.SUCCEEDED
    assert fresh(run).result == {"to": ["oncall@example.com"]}
    (effect,) = SideEffect.objects.filter(run=run)
    assert effect.request == {"to": ["oncall@example.com"]}
    # Its own key: the plan's key with the edit's digest, never the plan's key itself.
    assert effect.idempotency_key == ledger.edited_idempotency_key(
        run_id=run.id, step_id="send.mailer", tool="mailer", request={"to": ["oncall@example.com"]}
    )
    assert mailer.executed == {effect.idempotency_key: 1}
    # The audit trail names the original, the edit and who approved.
    assert effect.approval["original"] == {"to": ["all@example.com"]}
    assert effect.approval["edited"] == {"to": ["oncall@example.com"]}
    assert effect.approval["request_id"] == request.id
    return run


def test_the_report_shows_the_plan_and_the_approved_edit(make_agent, mailer, client, viewer):
    run = sent_with_edits(make_agent, mailer)
    client.force_login(viewer)
    page = client.get(f"/side-effects/runs/{run.id}/").content.decode()
    assert "data-approval-edit" in page
    assert "all@example.com" in page and "oncall@example.com" in page
    api = client.get(f"/api/runs/{run.id}/report").json()
    rows = [row for group in api["groups"] for row in group["rows"]]
    assert rows[0]["approval"]["original"] == {"to": ["all@example.com"]}
    assert rows[0]["approval"]["edited"] == {"to": ["oncall@example.com"]}
    assert rows[0]["approval"]["edited_by"] == "system"
    assert "Approved with edits by" in page


def test_an_irreversible_call_sent_back_raises_approval_denied_with_the_response(
    make_agent, mailer
) -> None:
    agent = make_agent()

    @agent.step
    def send(ctx, state):
        try:
            ctx.side_effect("mailer", "ops", {"to": ["all@example.com"]})
        except ApprovalDenied as exc:
            return ctx.done({"responded": exc.approval.responded, "why": exc.approval.comment})
        return ctx.done({"sent": True})

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    answer(run, {"decision": "respond", "comment": "only on-call"})
    assert run_next(agent) == Ended.SUCCEEDED
    assert fresh(run).result == {"responded": True, "why": "only on-call"}
    assert not mailer.executed


def test_an_agents_policy_in_code_is_checked_and_applied(make_agent) -> None:
    with pytest.raises(ValueError, match="required must be a whole number"):
        make_agent(approval_policy={"required": 0})
    agent = make_agent(
        approval_policy={"required": 1, "rules": [{"match": "resize:pool-*", "required": 2}]}
    )

    @agent.step
    def plan(ctx, state):
        ctx.approve("resize", "pool-a", {"size": {"from": 3, "to": 5}})
        return ctx.done(None)

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    policy = fresh(run).pending_request.policy
    assert policy["required"] == 2 and policy["rule"] == "resize:pool-*"
    assert policy["source"] == "code"
