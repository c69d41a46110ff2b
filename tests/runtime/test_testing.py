"""The harness, ``runtime.testing``: the demo agents tested with it, and its own promises
(the runtime's rules, in memory). The invoice chaser's tests are in test_invoice_chaser.py."""

from __future__ import annotations

import inspect
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ledger.tools import ActionFailed, OutcomeUnknown
from ledger.tools.config_store import ConfigStore, ConfigStoreTool
from runtime.context import Context
from runtime.demo_agents import auth_token_migration, flaky_deploy, nightly_report, webhook_fanout
from runtime.sdk import Agent, Next, RetryPolicy
from runtime.testing import FakeContext, FakeTool, HarnessError, run_agent

# -- the demo agents ------------------------------------------------------------------------


def test_flaky_deploy_backs_off_on_the_fake_clock_and_does_not_build_again() -> None:
    run = run_agent(flaky_deploy.agent, {"service": "checkout", "mode": "transient", "failures": 2})
    assert run.status == "succeeded"
    assert run.result["rolled_out_in_attempt"] == 3
    assert [a.reason for a in run.attempts] == ["initial", "auto_retry", "auto_retry"]
    assert run.steps_run == ["build", "rollout", "rollout", "rollout", "verify"]
    # backoff_initial 1 s, multiplier 2, jitter 0.2: 0.8 to 1 s, then 1.6 to 2 s.
    assert 0.8 <= run.clock.backoffs[0] <= 1.0 and 1.6 <= run.clock.backoffs[1] <= 2.0
    assert run.cost == Decimal("0.05")


def test_flaky_deploy_stops_at_once_on_a_non_retryable_error() -> None:
    run = run_agent(flaky_deploy.agent, {"service": "checkout", "mode": "deterministic"})
    assert (run.status, run.failure_class, run.error["type"]) == (
        "failed",
        "deterministic",
        "ImageRejected",
    )
    assert len(run.attempts) == 1 and run.clock.backoffs == []


def test_flaky_deploy_stops_on_the_same_error_three_times() -> None:
    run = run_agent(flaky_deploy.agent, {"service": "checkout", "mode": "repeated"})
    assert run.failure_class == "repeated_error"
    assert len(run.attempts) == 3


def test_nightly_report_waits_five_minutes_without_waiting() -> None:
    run = run_agent(nightly_report.agent, {"day": "2026-01-01"})
    assert run.status == "succeeded"
    assert 270 <= run.clock.now <= 300


def test_webhook_fanout_crash_after_one_delivery_looks_it_up_and_sends_each_once() -> None:
    hook = FakeTool("webhook", reversibility="irreversible")  # a receiver that can be asked
    run = run_agent(
        webhook_fanout.agent,
        {"base_url": "https://hooks.example"},
        tools={"webhook": hook},
        crash_after="fan_out.notify-search",
    )
    assert run.status == "succeeded"
    assert len(hook.performed) == 3 and len(hook.calls) == 3
    assert run.side_effects["fan_out.notify-billing"].decisions == ["act", "reuse"]
    assert run.side_effects["fan_out.notify-search"].decisions == ["act", "look_up"]
    assert run.result["delivered"]["search"] == "webhook-2"


def test_webhook_fanout_without_a_lookup_url_a_crash_after_the_act_is_unknown(
    settings: Any,
) -> None:
    # The default fake is like the real tool: without HOLDPOINT_WEBHOOK_LOOKUP_URL the
    # webhook cannot be asked, so nobody can tell whether the crashed delivery arrived.
    settings.HOLDPOINT_WEBHOOK_LOOKUP_URL = ""
    run = run_agent(
        webhook_fanout.agent,
        {"base_url": "https://hooks.example"},
        crash_after="fan_out.notify-search",
    )
    assert run.failure_class == "side_effect_unknown"
    assert run.side_effects["fan_out.notify-search"].status == "unknown"
    assert len(run.tools["webhook"].calls) == 2  # analytics was never tried


def test_webhook_fanout_an_unknown_delivery_stops_the_run() -> None:
    hook = FakeTool("webhook", reversibility="irreversible")
    hook.fail = [OutcomeUnknown("timed out after the request was sent")]
    run = run_agent(
        webhook_fanout.agent, {"base_url": "https://hooks.example"}, tools={"webhook": hook}
    )
    assert run.failure_class == "side_effect_unknown"
    assert run.side_effects["fan_out.notify-billing"].status == "unknown"


@pytest.fixture
def store(settings: Any, tmp_path: Path) -> ConfigStoreTool:
    settings.HOLDPOINT_CONFIG_STORE_DIR = tmp_path
    return ConfigStoreTool(root=tmp_path)


def test_auth_token_migration_with_the_real_config_store(store: ConfigStoreTool) -> None:
    mail = FakeTool("email", reversibility="irreversible", can_look_up=False)
    run = run_agent(
        auth_token_migration.agent,
        {"notify": "auth-team@example.com"},
        answers=[{"versions": ["v3", "v2"]}],
        approvals=["approve", "approve"],
        tools={"config_store": store, "email": mail},
    )
    assert run.status == "succeeded", run.error
    assert run.result["accepted_versions"] == ["v2", "v3"]
    assert run.result["written"] == "staging/auth/config@v2"
    newest = ConfigStore(store.store().root).read("staging/auth/config")
    assert newest is not None and newest.content["accepted_versions"] == ["v2", "v3"]
    assert [q.kind for q in run.questions] == ["input_required", "auth_required", "auth_required"]
    assert mail.calls[0][0]["to"] == ["auth-team@example.com"]


def test_auth_token_migration_approved_with_edits_writes_the_edit(store: ConfigStoreTool) -> None:
    """The harness answers an editable approval as a person does on the card (issue 18):
    the step gets the edited arguments, checked against the schema it offered."""
    mail = FakeTool("email", reversibility="irreversible", can_look_up=False)
    run = run_agent(
        auth_token_migration.agent,
        {"notify": "auth-team@example.com"},
        answers=[{"versions": ["v3", "v2"]}],
        approvals=[{"decision": "approve", "edited": {"accepted_versions": ["v3"]}}, "approve"],
        tools={"config_store": store, "email": mail},
    )
    assert run.status == "succeeded", run.error
    assert run.result["accepted_versions"] == ["v3"]
    newest = ConfigStore(store.store().root).read("staging/auth/config")
    assert newest is not None and newest.content["accepted_versions"] == ["v3"]
    # An edit that breaks the schema is the test's mistake, said at once.
    with pytest.raises(HarnessError, match="does not fit"):
        run_agent(
            auth_token_migration.agent,
            {"notify": "auth-team@example.com"},
            answers=[{"versions": ["v3", "v2"]}],
            approvals=[{"decision": "approve", "edited": {"accepted_versions": "v3"}}],
            tools={"config_store": store, "email": mail},
        )


def test_auth_token_migration_sent_back_asks_again(store: ConfigStoreTool) -> None:
    mail = FakeTool("email", reversibility="irreversible", can_look_up=False)
    run = run_agent(
        auth_token_migration.agent,
        {"notify": "auth-team@example.com"},
        answers=[{"versions": ["v3", "v2"]}, {"versions": ["v3"]}],
        approvals=[{"decision": "respond", "comment": "keep v2 out"}, "approve", "approve"],
        tools={"config_store": store, "email": mail},
    )
    assert run.status == "succeeded", run.error
    assert run.result["accepted_versions"] == ["v3"]
    kinds = [q.kind for q in run.questions]
    assert kinds == [
        "input_required",
        "auth_required",
        "input_required",
        "auth_required",
        "auth_required",
    ]


def test_auth_token_migration_sees_an_edit_made_while_the_question_was_open(
    store: ConfigStoreTool,
) -> None:
    reads = {"n": 0}
    real = auth_token_migration.read_config

    def edited_meanwhile(document: str) -> Any:
        reads["n"] += 1
        config = real(document)
        if config is not None and reads["n"] >= 4:  # after the question was asked
            config = {**config, "version": config["version"] + 1}
        return config

    original = auth_token_migration.read_config
    auth_token_migration.read_config = edited_meanwhile
    try:
        run = run_agent(
            auth_token_migration.agent,
            {"notify": "auth-team@example.com"},
            answers=[{"versions": ["v2"]}],
            tools={"config_store": store},
        )
    finally:
        auth_token_migration.read_config = original
    assert run.status == "auth_required"
    assert any(log["message"] == "config changed while the run was waiting" for log in run.logs)


# -- the harness's own promises --------------------------------------------------------------


@pytest.fixture
def agent() -> Any:
    made = Agent(
        name="harness-probe", retry=RetryPolicy(max_attempts=3, backoff_initial=2.0, jitter=0)
    )
    yield made
    made.unregister()


def test_a_question_without_an_answer_left_stops_the_run_where_it_asked(agent: Agent) -> None:
    @agent.step(start=True)
    def first(ctx: Any, state: Any) -> Any:
        a = ctx.ask("One?", {"n": "integer"})
        b = ctx.ask("Two?", {"n": "integer"})
        return ctx.done(a["n"] + b["n"])

    assert run_agent(agent, answers=[{"n": 1}, {"n": 2}]).result == 3
    waiting = run_agent(agent, answers=[{"n": 1}])
    assert waiting.status == "input_required"
    assert waiting.pending is not None and waiting.pending.key == "first.ask#2"


def test_an_answer_that_does_not_fit_the_schema_is_the_tests_mistake(agent: Agent) -> None:
    @agent.step(start=True)
    def first(ctx: Any, state: Any) -> Any:
        return ctx.done(ctx.ask("How many?", {"n": "integer"}))

    with pytest.raises(HarnessError, match="/n"):
        run_agent(agent, answers=[{"n": "many"}])


def test_the_retry_budget_is_spent_after_max_attempts_failures(agent: Agent) -> None:
    calls = []

    @agent.step(start=True)
    def first(ctx: Any, state: Any) -> Any:
        calls.append(ctx.attempt_number)
        # A different message each time, so that it is not the same error again.
        raise ConnectionError(["reset", "refused", "dropped"][len(calls) - 1])

    run = run_agent(agent)
    assert (run.status, run.failure_class) == ("failed", "transient")
    assert "Retry budget spent (3 of 3" in run.error["message"]
    assert calls == [1, 2, 3] and run.clock.backoffs == [2.0, 4.0]


def test_a_state_is_json_between_steps(agent: Agent) -> None:
    @agent.step(start=True)
    def first(ctx: Any, state: Any) -> Any:
        return ctx.next("second", {"when": (1, 2)})

    @agent.step
    def second(ctx: Any, state: Any) -> Any:
        return ctx.done(state["when"])

    assert run_agent(agent).result == [1, 2]  # a tuple comes back a list, as from the database


def test_a_crash_point_never_reached_is_an_error_of_the_test(agent: Agent) -> None:
    @agent.step(start=True)
    def first(ctx: Any, state: Any) -> Any:
        return ctx.done(1)

    with pytest.raises(HarnessError, match="never reached"):
        run_agent(agent, crash_after="nowhere.webhook")


def test_a_request_that_breaks_the_tools_schema_fails_deterministic(agent: Agent) -> None:
    @agent.step(start=True)
    def first(ctx: Any, state: Any) -> Any:
        ctx.side_effect("config_store", "doc", {"document": "a/b", "contents": {}})
        return ctx.done()

    run = run_agent(agent)
    assert run.failure_class == "deterministic"
    assert "docs/tools.md" in run.error["message"]


def test_a_failed_act_is_done_again_with_the_same_key(agent: Agent) -> None:
    tool = FakeTool("config_store", fail=[ActionFailed("disk full")])

    @agent.step(start=True)
    def first(ctx: Any, state: Any) -> Any:
        done = ctx.side_effect("config_store", "doc", {"document": "a/b", "content": 1})
        return ctx.done(done.external_reference)

    run = run_agent(agent, tools={"config_store": tool})
    assert run.result == "config_store-1"
    assert len({key for _, key in tool.calls}) == 1 and len(tool.calls) == 2


def test_a_step_can_be_called_with_a_fake_context_alone() -> None:
    def plan(ctx: Any, state: Any) -> Any:
        answer = ctx.ask("Tone?", {"tone": "string"})
        ctx.log("planned", tone=answer["tone"])
        return ctx.next("send", {"tone": answer["tone"]})

    ctx = FakeContext(
        input={"customer": "acme"}, step="plan", answers={"plan.ask": {"tone": "firm"}}
    )
    assert plan(ctx, {}) == Next("send", {"tone": "firm"})
    assert ctx.logs == [{"step": "plan", "message": "planned", "level": "info", "tone": "firm"}]
    with pytest.raises(HarnessError, match=r"plan\.ask"):
        plan(FakeContext(step="plan"), {})


def test_the_fake_context_offers_every_call_of_the_real_one() -> None:
    def public(cls: type) -> set[str]:
        return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")}

    assert public(Context) - public(FakeContext) == set()
