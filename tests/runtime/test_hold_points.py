"""ask / approve: the step re-runs from its checkpoint and the same call returns the answer.

The matching rule under test (README, "Workers and agents"): an answer belongs to the
checkpoint its question was asked on, under the hold point's key
(``<step>.ask``, ``<step>.ask#2``, ``<step>.<key>``); a retry by a person asks again.
"""

from __future__ import annotations

import datetime as dt

import pytest
import time_machine
from django.utils import timezone

from runs import services
from runs.models import Attempt, InputRequest
from runtime.executor import Outcome
from runtime.sdk import ApprovalDenied
from tests.runs.factory import allow_preapproval, preapprover
from tests.runtime.conftest import claim, events, expire_lease, fresh, run_next

pytestmark = pytest.mark.django_db


def answer(run, value, user=None):
    run = fresh(run)
    request = run.pending_request
    assert request is not None, f"run is {run.status}, not waiting"
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=request.checkpoint_id,
        value=value,
        user=user,
    )
    return request


def test_the_step_re_runs_and_the_same_ask_returns_the_answer(make_agent, operator) -> None:
    agent = make_agent()
    runs_of_pick: list[int] = []

    @agent.step
    def inspect(ctx, state):
        return ctx.next("pick", {"available": ["v1", "v2", "v3"]})

    @agent.step
    def pick(ctx, state):
        runs_of_pick.append(ctx.attempt_number)
        chosen = ctx.ask(
            "请选择需要保持兼容的 Token 版本",
            {"versions": "string[]"},
            expires_in=3600,
            context={"available": state["available"]},
        )
        return ctx.done({"keep": chosen["versions"], "resumed": ctx.resumed})

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.INTERRUPTED
    run = fresh(run)
    assert run.status == "input_required"
    request = run.pending_request
    assert request.step_id == "pick.ask"
    assert request.prompt == "请选择需要保持兼容的 Token 版本"
    assert request.context == {"available": ["v1", "v2", "v3"]}
    assert request.checkpoint.step == "pick"
    assert request.checkpoint_id == run.latest_checkpoint_id
    assert request.accepted_schema["properties"]["versions"]["type"] == "array"

    answer(run, {"versions": ["v2"]}, user=operator)
    assert run_next(agent) == Outcome.SUCCEEDED
    run = fresh(run)
    assert run.result == {"keep": ["v2"], "resumed": True}
    assert runs_of_pick == [1, 2]
    assert InputRequest.objects.filter(run=run).count() == 1


def test_a_step_that_asks_twice_keeps_its_first_answer(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        name = ctx.ask("Name?", {"name": "string"})
        colour = ctx.ask("Colour?", {"colour": "string"})
        return ctx.done({**name, **colour})

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    first = answer(run, {"name": "ada"})
    run_next(agent)
    second = answer(run, {"colour": "blue"})
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result == {"name": "ada", "colour": "blue"}
    assert (first.step_id, second.step_id) == ("only.ask", "only.ask#2")
    assert first.checkpoint_id == second.checkpoint_id
    assert InputRequest.objects.filter(run=run).count() == 2


def test_a_step_that_loops_asks_again_on_its_next_checkpoint(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def review(ctx, state):
        verdict = ctx.ask(f"Round {state.get('round', 1)}: ok?", {"ok": "boolean"})
        if not verdict["ok"]:
            return ctx.next("review", {"round": state.get("round", 1) + 1})
        return ctx.done({"rounds": state.get("round", 1)})

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    answer(run, {"ok": False})
    # The answer is for round 1's checkpoint; round 2 asks anew instead of reusing it.
    assert run_next(agent) == Outcome.INTERRUPTED
    assert fresh(run).pending_request.prompt == "Round 2: ok?"
    answer(run, {"ok": True})
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result == {"rounds": 2}


def test_an_answer_survives_a_crash_of_the_worker_that_resumed(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        return ctx.done(ctx.ask("Go?", {"go": "boolean"}))

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    answer(run, {"go": True})
    claim(agent, "crashes")  # claimed, then the worker dies before finishing the step
    expire_lease(run.id)
    assert services.leases_expire() == 1
    lease = claim(agent, "w2")
    # The next attempt from the same checkpoint carries the answer the lost one was given.
    assert lease.reason == "lease_expired" and lease.resume_request is not None
    from runtime.executor import execute

    assert execute(lease, heartbeat=False) == Outcome.SUCCEEDED
    assert fresh(run).result == {"go": True}
    assert InputRequest.objects.filter(run=run).count() == 1


def test_a_retry_after_an_expired_question_asks_again(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        return ctx.done(ctx.ask("Go?", {"go": "boolean"}, expires_in=60))

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    with time_machine.travel(timezone.now() + dt.timedelta(seconds=61)):
        assert services.requests_expire() == 1
    assert fresh(run).failure_class == "input_expired"
    services.run_retry(run_id=run.id, reason="ask again")
    assert run_next(agent) == Outcome.INTERRUPTED
    run = fresh(run)
    assert run.status == "input_required"
    assert InputRequest.objects.filter(run=run).count() == 2


def test_a_denial_is_a_value_the_agent_acts_on(make_agent, approver) -> None:
    agent = make_agent()

    @agent.step
    def change(ctx, state):
        approval = ctx.approve(
            "update_auth_config",
            "staging/auth/config",
            {"keep_versions": ["v2"]},
            expires_in=600,
            tool="config_store",
            reversibility="compensable",
        )
        if approval.denied:
            return ctx.done({"changed": False, "why": approval.comment, "by": approval.answered_by})
        return ctx.done({"changed": True})

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.INTERRUPTED
    run = fresh(run)
    assert run.status == "auth_required"
    request = run.pending_request
    assert request.step_id == "change.approve"
    assert request.prompt == "Approve update_auth_config on staging/auth/config?"
    assert request.action == {
        "tool": "config_store",
        "action": "update_auth_config",
        "target": "staging/auth/config",
        "change": {"keep_versions": ["v2"]},
        "reversibility": "compensable",
    }
    answer(run, {"decision": "deny", "comment": "not during the freeze"}, user=approver)
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result == {"changed": False, "why": "not during the freeze", "by": "alice"}


def test_a_retry_after_a_denial_asks_again(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def change(ctx, state):
        approval = ctx.approve("drop_table", "prod/users")
        if approval.denied:
            raise ApprovalDenied("drop_table was denied", approval=approval)
        return ctx.done("dropped")

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    answer(run, {"decision": "deny", "comment": "not now"})
    assert run_next(agent) == Outcome.FAILED
    assert fresh(run).failure_class == "denied"
    services.run_retry(run_id=run.id, reason="asked the DBA again")
    assert run_next(agent) == Outcome.INTERRUPTED
    answer(run, {"decision": "approve"})
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result == "dropped"


def test_an_approval_given_at_start_is_used_without_asking(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def change(ctx, state):
        return ctx.done(ctx.approve("restart", "staging/api").approved)

    allow_preapproval(agent.name)
    run = services.run_start(
        agent=agent.name, input={}, approvals=["change.approve"], user=preapprover()
    )
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result is True
    assert not InputRequest.objects.filter(run=run).exists()


def test_a_key_names_the_hold_point(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        return ctx.done(ctx.ask("Region?", {"region": "string"}, key="region"))

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    assert fresh(run).pending_request.step_id == "only.region"


def test_a_bad_schema_fails_the_attempt_deterministically(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        return ctx.done(ctx.ask("Which?", {"versions": "strings[]"}))

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.FAILED
    run = fresh(run)
    assert (run.status, run.failure_class) == ("failed", "deterministic")
    assert "invalid_input" in Attempt.objects.get(run=run).error_message


def test_the_step_re_observes_after_a_resume_and_sees_what_changed(make_agent) -> None:
    agent = make_agent()
    config = {"version": 3, "tokens": ["v1", "v2"]}

    @agent.step
    def migrate(ctx, state):
        seen = ctx.observe("config", lambda: dict(config))
        keep = ctx.ask("Keep which?", {"versions": "string[]"})
        if ctx.changed("config"):
            return ctx.done({"stale_answer": True, "now": seen["version"]})
        return ctx.done({"keep": keep["versions"], "version": seen["version"]})

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    request = fresh(run).pending_request
    # The person sees what the step saw when it asked.
    assert request.context["observed"]["config"]["value"] == {"version": 3, "tokens": ["v1", "v2"]}
    config["version"] = 4  # someone changed the config while the run was waiting
    answer(run, {"versions": ["v2"]})
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result == {"stale_answer": True, "now": 4}
    (log,) = events(run.id, "agent.log")
    assert log.payload["level"] == "warning"
    assert log.payload["message"] == "config changed while the run was waiting"
    assert log.payload["data"]["before"]["version"] == 3
    assert log.payload["data"]["after"]["version"] == 4


def test_an_unchanged_observation_is_not_reported(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        ctx.observe("clock", lambda: "fixed")
        ctx.ask("Go?", {"go": "boolean"})
        return ctx.done(ctx.changed("clock"))

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    answer(run, {"go": True})
    run_next(agent)
    assert fresh(run).result is False
    assert events(run.id, "agent.log") == []


def test_an_agent_except_exception_does_not_swallow_the_hold_point(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def only(ctx, state):
        try:
            value = ctx.ask("Go?", {"go": "boolean"})
        except Exception:  # an over-broad handler in agent code
            value = "swallowed"
        return ctx.done(value)

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.INTERRUPTED
    assert fresh(run).status == "input_required"


def test_an_approval_of_an_empty_change_is_not_asked_and_the_timeline_says_why(
    make_agent,
) -> None:
    agent = make_agent()

    @agent.step
    def change(ctx, state):
        approval = ctx.approve(
            "update_auth_config",
            "staging/auth/config",
            {"accepted_versions": {"from": ["v2"], "to": ["v2"]}, "base_version": 3},
            tool="config_store",
        )
        return ctx.done({"approved": approval.approved, "unchanged": approval.unchanged})

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result == {"approved": True, "unchanged": True}
    assert not InputRequest.objects.filter(run=run).exists()
    [log] = events(run.id, "agent.log")
    assert "the planned change is empty" in log.payload["message"]


def test_an_approval_of_a_real_change_is_still_asked(make_agent) -> None:
    agent = make_agent()

    @agent.step
    def change(ctx, state):
        ctx.approve("update", "doc", {"accepted_versions": {"from": ["v1", "v2"], "to": ["v2"]}})
        return ctx.done(True)

    services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.INTERRUPTED


def test_an_effect_done_under_an_approval_records_who_approved(
    make_agent, approver, settings, tmp_path
) -> None:
    from ledger.models import SideEffect

    settings.HOLDPOINT_CONFIG_STORE_DIR = tmp_path / "config-store"
    agent = make_agent()

    @agent.step
    def write(ctx, state):
        ctx.approve("update_auth_config", "app", {"ttl": {"from": 60, "to": 30}})
        ctx.side_effect("config_store", "app", {"document": "app", "content": {"ttl": 30}})
        return ctx.done(True)

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.INTERRUPTED
    answer(run, {"decision": "approve", "comment": "after the freeze"}, user=approver)
    assert run_next(agent) == Outcome.SUCCEEDED
    effect = SideEffect.objects.get(run=run)
    assert effect.approval["by"] == "alice"
    assert effect.approval["comment"] == "after the freeze"
    assert effect.approval["source"] == "request" and effect.approval["at"]


def test_an_approval_in_an_earlier_step_about_the_same_tool_and_target_is_recorded(
    make_agent, approver, settings, tmp_path
) -> None:
    """The demo agent approves in ``approve`` and writes in ``write``: the write records it."""
    from ledger.models import SideEffect

    settings.HOLDPOINT_CONFIG_STORE_DIR = tmp_path / "config-store"
    agent = make_agent()

    @agent.step
    def approve(ctx, state):
        ctx.approve(
            "update_auth_config", "app", {"ttl": {"from": 60, "to": 30}}, tool="config_store"
        )
        return ctx.next("write")

    @agent.step
    def write(ctx, state):
        ctx.side_effect("config_store", "app", {"document": "app", "content": {"ttl": 30}})
        return ctx.done(True)

    run = services.run_start(agent=agent.name, input={})
    assert run_next(agent) == Outcome.INTERRUPTED
    answer(run, {"decision": "approve", "comment": "go"}, user=approver)
    assert run_next(agent) == Outcome.SUCCEEDED
    effect = SideEffect.objects.get(run=run)
    assert (effect.approval["by"], effect.approval["comment"]) == ("alice", "go")
