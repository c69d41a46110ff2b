"""OpenAI Agents SDK agents under Holdpoint (``holdpoint_client.openai_agents``) against a
live server: the SDK's human-in-the-loop example (a tool with ``needs_approval``) answered
through the approval API — approve, approve with edits, send back, deny —, a worker
SIGKILLed between turns that resumes from the last turn with no model call or tool call of
an earlier turn repeated, a worker SIGKILLed after the approved act (the next one looks it
up), and a cancel inside a tool. The model is scripted (no provider, no network)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from runs import services
from runs.errors import HoldpointError
from runs.models import Attempt, Checkpoint, Run, RunEvent
from tests.clients.conftest import (
    answer,
    executions,
    pending,
    wait_for,
    wait_pending,
    wait_status,
)

try:
    import agents  # noqa: F401
except ImportError:  # pragma: no cover - make test installs the extra
    if os.environ.get("CI"):
        raise
    pytest.skip("pip install './clients/python[openai-agents]'", allow_module_level=True)

from tests.clients.sdk_agents import AGENTS

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]


def visits(tool_dir: Path) -> list[str]:
    log = tool_dir / "nodes.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def review_run(operator: Any, note: str = "bring an umbrella") -> str:
    return services.run_start(agent="oa-review", input={"input": note}, user=operator).id


@pytest.fixture
def sdk_agents(worker) -> Any:
    return worker(AGENTS)


def test_an_approved_tool_call_runs_once_and_each_turn_is_a_checkpoint(
    sdk_agents, operator, approver, tool_dir: Path
) -> None:
    run_id = review_run(operator)
    # needs_approval is an approval hold point: the call's arguments as the planned change,
    # editable in the card's form built from the tool's parameters.
    card = wait_pending(run_id, "auth_required")
    assert card.action["tool"] == "write_note"
    assert card.action["change"] == {"city": "sf", "note": "bring an umbrella"}
    assert card.action["editable"]["value"] == {"city": "sf", "note": "bring an umbrella"}
    schema = card.action["editable"]["schema"]
    assert schema["properties"]["city"]["type"] == "string"
    assert schema["required"] == ["city", "note"]
    assert card.context["call_id"] == "call_write_note"
    assert card.prompt.startswith("Approve write_note(")
    # Nothing ran while people decide; the model was asked once per turn so far.
    assert executions(tool_dir) == []
    assert visits(tool_dir) == ["model0", "forecast", "model1"]
    answer(run_id, card, {"decision": "approve"}, approver)
    wait_status(run_id, "succeeded")
    run = Run.objects.get(pk=run_id)
    assert run.result["agent"] == "note-writer"
    assert run.result["output"].startswith("Done: written folder:")
    assert run.result["output"].endswith("for sf: bring an umbrella")
    [written] = [p.read_text() for p in tool_dir.glob("*.json")]
    assert '"city": "sf"' in written
    # A checkpoint per turn, holding the SDK's serialized RunState; the interrupted turn is
    # saved before anyone is asked (step review), so the answer does not ask the model again.
    checkpoints = list(Checkpoint.objects.filter(run_id=run_id).order_by("number"))
    assert [c.step for c in checkpoints] == ["turn", "turn", "review", "turn"]
    assert all("current_turn" in c.state["run_state"] for c in checkpoints[1:])
    assert visits(tool_dir) == ["model0", "forecast", "model1", "write_note", "model2"]
    assert len(executions(tool_dir)) == 1


def test_an_edited_tool_call_runs_with_the_edited_arguments(
    sdk_agents, operator, approver, tool_dir: Path
) -> None:
    run_id = review_run(operator)
    card = wait_pending(run_id, "auth_required")
    answer(
        run_id, card, {"decision": "approve", "edited": {"city": "nyc", "note": "edited"}}, approver
    )
    wait_status(run_id, "succeeded")
    # The SDK approved the call, and the tool was invoked with the edited arguments.
    assert Run.objects.get(pk=run_id).result["output"].endswith("for nyc: edited")
    [written] = [p.read_text() for p in tool_dir.glob("*.json")]
    assert '"city": "nyc"' in written and '"note": "edited"' in written
    card.refresh_from_db()
    assert card.answer["edited"] == {"city": "nyc", "note": "edited"}
    assert card.action["editable"]["value"] == {"city": "sf", "note": "bring an umbrella"}


def test_an_edit_the_tool_schema_refuses_changes_nothing(
    sdk_agents, operator, approver, tool_dir: Path
) -> None:
    run_id = review_run(operator)
    card = wait_pending(run_id, "auth_required")
    with pytest.raises(HoldpointError) as refused:
        answer(run_id, card, {"decision": "approve", "edited": {"city": 7, "note": "x"}}, approver)
    assert refused.value.code == "invalid_input"
    assert pending(run_id) is not None and pending(run_id).id == card.id
    assert executions(tool_dir) == []


def test_send_back_tells_the_model_and_deny_rejects_the_call(
    sdk_agents, operator, approver, tool_dir: Path
) -> None:
    sent_back = review_run(operator)
    answer(
        sent_back,
        wait_pending(sent_back, "auth_required"),
        {"decision": "respond", "comment": "Use the cache instead"},
        approver,
    )
    denied = review_run(operator, "other")
    answer(
        denied,
        wait_pending(denied, "auth_required"),
        {"decision": "deny", "comment": "not this one"},
        approver,
    )
    wait_status(sent_back, "succeeded")
    wait_status(denied, "succeeded")
    # Send back → reject(rejection_message=<comment>): the model reads the comment as the
    # tool's answer and goes on. Deny → reject with a message saying who denied it and why.
    assert Run.objects.get(pk=sent_back).result["output"] == "Done: Use the cache instead"
    output = Run.objects.get(pk=denied).result["output"]
    assert output.startswith("Done: A person denied this call of write_note by ")
    assert "not this one" in output
    assert executions(tool_dir) == []
    assert "write_note" not in visits(tool_dir)


def test_a_worker_killed_between_turns_resumes_from_the_last_turn(
    spawn, operator, tool_dir: Path
) -> None:
    first, _ = spawn("oa-killed", "tests.clients.sdk_agents:AGENTS", HOLDPOINT_TEST_LINGER="60")
    run_id = services.run_start(agent="oa-chain", input={"input": "go"}, user=operator).id
    wait_for(lambda: "linger" in visits(tool_dir), 40, "the agent to reach its second turn")
    # The first turn (a model call and the write through the ledger) is a checkpoint.
    assert Checkpoint.objects.filter(run_id=run_id, state__n=1).exists()
    first.kill()
    first.wait(10)
    spawn("oa-next", "tests.clients.sdk_agents:AGENTS")
    wait_status(run_id, "succeeded", timeout=60)
    assert Run.objects.get(pk=run_id).result["output"] == "Done after 2 tool calls"
    # The first turn was not redone: its model call and its tool call ran once. The second
    # turn, killed inside, ran again from the checkpoint after the first.
    seen = visits(tool_dir)
    assert seen.count("model0") == 1
    assert seen.count("write") == 1
    assert seen.count("model1") == 2
    assert seen.count("linger") == 2
    assert seen.count("model2") == 1
    assert len(executions(tool_dir)) == 1
    assert RunEvent.objects.filter(run_id=run_id, type="attempt.claimed").count() >= 2


def test_a_worker_killed_after_the_approved_act_looks_it_up_and_does_not_repeat_it(
    spawn, operator, approver, tool_dir: Path
) -> None:
    (tool_dir / "hang-after-execute").touch()
    first, _ = spawn("oa-act", "tests.clients.sdk_agents:AGENTS")
    run_id = review_run(operator)
    answer(run_id, wait_pending(run_id, "auth_required"), {"decision": "approve"}, approver)
    # write_note wrote its file and hangs before its outcome is recorded; its worker dies.
    wait_for(lambda: (tool_dir / "hanging").exists(), 40, "the act to hang")
    first.kill()
    first.wait(10)
    spawn("oa-after", "tests.clients.sdk_agents:AGENTS")
    wait_status(run_id, "succeeded", timeout=60)
    # The next worker ran the review again, looked the act up under the ledger's key and
    # did not act a second time; the model read the looked-up outcome.
    [execution] = executions(tool_dir)
    assert execution.split()[1] == str(first.pid)
    assert visits(tool_dir).count("write_note") == 2
    types = set(RunEvent.objects.filter(run_id=run_id).values_list("type", flat=True))
    assert {"side_effect.look_up", "side_effect.confirmed"} <= types
    assert Run.objects.get(pk=run_id).result["output"].startswith("Done: written folder:")


def test_a_run_cancelled_inside_a_tool_stops_there(
    worker, operator, tool_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOLDPOINT_TEST_LINGER", "60")
    w = worker(AGENTS)
    run_id = services.run_start(agent="oa-chain", input={"input": "go"}, user=operator).id
    wait_for(lambda: "linger" in visits(tool_dir), 40, "the agent to reach linger")
    services.run_cancel(run_id=run_id, user=operator, reason="wrong target")
    wait_status(run_id, "cancelled", timeout=30)
    # The tool's ctx.sleep woke on the cancel and unwound through the SDK's run: the worker
    # reports the attempt cancelled (not failed), and the model was not asked again.
    attempts = set(Attempt.objects.filter(run_id=run_id).values_list("id", flat=True))
    wait_for(
        lambda: any(a in attempts and o == "cancelled" for a, o in w.outcomes),
        15,
        "the worker to say so",
    )
    assert "failed" not in [o for a, o in w.outcomes if a in attempts], w.outcomes
    assert "model2" not in visits(tool_dir)
    assert len(executions(tool_dir)) == 1
