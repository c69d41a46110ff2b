"""LangGraph graphs under Holdpoint (``holdpoint_client.langgraph``) against a live
server: LangGraph's human-in-the-loop examples answered from Holdpoint's hold points —
approve a tool call, edit it, respond instead, ignore it, ask the human — a worker
SIGKILLed between nodes that resumes from the last node with no tool call repeated, and a
graph run cancelled inside a node and paused at a node boundary."""

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
    import langgraph  # noqa: F401
except ImportError:  # pragma: no cover - make test installs the extra
    if os.environ.get("CI"):
        raise
    pytest.skip("pip install './clients/python[langgraph]'", allow_module_level=True)

from tests.clients.graphs import AGENTS

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]


def nodes(tool_dir: Path) -> list[str]:
    log = tool_dir / "nodes.log"
    return [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []


def review_run(operator: Any) -> str:
    return services.run_start(agent="lg-review", input={"request": "note"}, user=operator).id


@pytest.fixture
def graphs(worker) -> Any:
    return worker(AGENTS)


def test_a_reviewed_tool_call_accepted_runs_once_with_its_arguments(
    graphs, operator, approver, tool_dir: Path
) -> None:
    run_id = review_run(operator)
    # A HumanInterrupt is an approval hold point: the approval card, the tool call's
    # arguments as the planned change, editable because the config allows edits.
    card = wait_pending(run_id, "auth_required")
    assert card.prompt.startswith("Run folder with")
    assert card.action["tool"] == "folder"
    assert card.action["change"] == {"city": "sf", "note": "note"}
    assert card.action["editable"]["value"] == {"city": "sf", "note": "note"}
    assert card.action["editable"]["schema"]["properties"]["city"] == {"type": "string"}
    assert card.action["reversibility"] == "compensable"  # The agent's folder tool.
    assert card.context["allowed"] == ["approve", "edit", "respond", "deny"]
    answer(run_id, card, {"decision": "approve"}, approver)
    wait_status(run_id, "succeeded")
    run = Run.objects.get(pk=run_id)
    assert run.result["review"] == "accepted"
    assert run.result["outcome"].startswith("folder:")
    assert len(executions(tool_dir)) == 1
    written = next(tool_dir.glob("*.json")).read_text()
    assert '"city": "sf"' in written
    # Each node boundary is a Holdpoint checkpoint holding the graph's state, named by the
    # node that runs next (the first, __start__, runs the graph's entry node).
    steps = list(
        Checkpoint.objects.filter(run_id=run_id).order_by("number").values_list("step", flat=True)
    )
    assert steps == ["__start__", "human_review", "run_tool"]
    # call_llm ran once: the answer resumed human_review, not the graph from the start.
    assert nodes(tool_dir).count("call_llm") == 1


def test_a_node_with_an_interrupt_runs_three_times_per_review_and_its_neighbours_once(
    graphs, operator, approver, tool_dir: Path
) -> None:
    """Why three (docs/agents.md, LangGraph graphs): the first attempt runs the node to its
    interrupt and asks. The attempt after the answer runs it again to its interrupt, to
    compare what it asks now with what the approval showed (an approval covers exactly the
    call it showed; a node may plan differently on a re-run), then LangGraph resumes it
    with the answer, which runs it from its start a third time. The nodes around it run
    once each."""
    run_id = review_run(operator)
    card = wait_pending(run_id, "auth_required")
    assert nodes(tool_dir).count("human_review") == 1  # up to the interrupt, then asked
    answer(run_id, card, {"decision": "approve"}, approver)
    wait_status(run_id, "succeeded")
    assert nodes(tool_dir).count("human_review") == 3
    assert nodes(tool_dir).count("call_llm") == 1
    assert nodes(tool_dir).count("run_tool") == 1
    assert len(executions(tool_dir)) == 1


def test_an_edited_tool_call_runs_with_the_edited_arguments(
    graphs, operator, approver, tool_dir
) -> None:
    run_id = review_run(operator)
    card = wait_pending(run_id, "auth_required")
    # Approve with edits through the approval API: the graph gets HumanResponse "edit".
    answer(
        run_id,
        card,
        {"decision": "approve", "edited": {"city": "nyc", "note": "edited"}},
        approver,
    )
    wait_status(run_id, "succeeded")
    assert Run.objects.get(pk=run_id).result["review"] == "edited"
    [written] = [p.read_text() for p in tool_dir.glob("*.json")]
    assert '"city": "nyc"' in written and '"note": "edited"' in written
    # The request records the original next to the edit, and who made it.
    card.refresh_from_db()
    assert card.answer["decision"] == "approve"
    assert card.answer["edited"] == {"city": "nyc", "note": "edited"}
    assert card.action["editable"]["value"] == {"city": "sf", "note": "note"}


def test_an_edit_the_schema_refuses_changes_nothing(graphs, operator, approver, tool_dir) -> None:
    run_id = review_run(operator)
    card = wait_pending(run_id, "auth_required")
    with pytest.raises(HoldpointError) as refused:
        answer(run_id, card, {"decision": "approve", "edited": {"city": 7}}, approver)
    assert refused.value.code == "invalid_input"
    assert pending(run_id) is not None and pending(run_id).id == card.id
    assert executions(tool_dir) == []


def test_send_back_and_deny_run_no_tool(graphs, operator, approver, tool_dir) -> None:
    responded = review_run(operator)
    answer(
        responded,
        wait_pending(responded, "auth_required"),
        {"decision": "respond", "comment": "use the cache instead"},
        approver,
    )
    ignored = review_run(operator)
    answer(
        ignored,
        wait_pending(ignored, "auth_required"),
        {"decision": "deny", "comment": "not this one"},
        approver,
    )
    wait_status(responded, "succeeded")
    wait_status(ignored, "succeeded")
    # Send back → HumanResponse "response" with the comment; deny → "ignore".
    assert Run.objects.get(pk=responded).result["review"] == "responded"
    assert Run.objects.get(pk=responded).result["outcome"] == "use the cache instead"
    assert Run.objects.get(pk=ignored).result["review"] == "ignored"
    assert executions(tool_dir) == []


def test_a_review_that_allows_no_edit_or_response_shows_no_form_and_ignores_a_send_back(
    graphs, operator, approver, tool_dir
) -> None:
    run_id = services.run_start(
        agent="lg-strict-review", input={"request": "note"}, user=operator
    ).id
    card = wait_pending(run_id, "auth_required")
    assert "editable" not in card.action
    assert card.context["allowed"] == ["approve", "deny"]
    answer(run_id, card, {"decision": "respond", "comment": "why?"}, approver)
    wait_status(run_id, "succeeded")
    # The graph allowed no free-text response: the send-back reaches it as "ignore".
    assert Run.objects.get(pk=run_id).result["review"] == "ignored"
    assert executions(tool_dir) == []


def test_the_graph_asks_the_human(graphs, operator, tool_dir) -> None:
    run_id = services.run_start(agent="lg-ask", input={}, user=operator).id
    card = wait_pending(run_id, "input_required")
    assert card.prompt == "Where are you?"
    assert card.context["interrupt"] == "Where are you?"
    answer(run_id, card, {"answer": "Lisbon"}, operator)
    wait_status(run_id, "succeeded")
    assert Run.objects.get(pk=run_id).result == {
        "location": "Lisbon",
        "greeting": "Weather in Lisbon: sunny",
    }


def test_a_worker_killed_between_nodes_resumes_from_the_last_node(
    spawn, operator, tool_dir: Path
) -> None:
    first, _ = spawn("lg-killed", "tests.clients.graphs:AGENTS", HOLDPOINT_TEST_LINGER="60")
    run_id = services.run_start(agent="lg-chain", input={}, user=operator).id
    wait_for(lambda: "linger" in nodes(tool_dir), 30, "the graph to reach linger")
    assert Checkpoint.objects.filter(run_id=run_id, step="linger").exists()
    first.kill()
    first.wait(10)
    spawn("lg-next", "tests.clients.graphs:AGENTS")
    wait_status(run_id, "succeeded", timeout=40)
    assert Run.objects.get(pk=run_id).result["done"] is True
    # write (the node with the tool call) ran once; linger ran again from its checkpoint.
    assert nodes(tool_dir).count("write") == 1
    assert nodes(tool_dir).count("linger") == 2
    assert len(executions(tool_dir)) == 1
    assert RunEvent.objects.filter(run_id=run_id, type="attempt.lost").exists() or (
        RunEvent.objects.filter(run_id=run_id, type="attempt.claimed").count() >= 2
    )


def loop_run(operator: Any, **input: Any) -> str:
    return services.run_start(agent="lg-loop", input=input, user=operator).id


def test_a_graph_run_is_cancelled_inside_a_node_and_the_worker_acknowledges(
    worker, operator, tool_dir: Path
) -> None:
    w = worker(AGENTS)
    # Three quick ticks, then the fourth sleeps a minute inside the node.
    run_id = loop_run(operator, steps=10, pause=0.1, hold_at=3)
    wait_status(run_id, "running")
    wait_for(lambda: nodes(tool_dir).count("tick") == 4, 20, "the graph to reach tick 4")
    services.run_cancel(run_id=run_id, user=operator, reason="wrong target")
    wait_status(run_id, "cancelled", timeout=20)
    # The node's ctx.sleep woke on the cancel and the step unwound through LangGraph's
    # stream: the worker reports the attempt cancelled (not failed, not a node error).
    attempts = set(Attempt.objects.filter(run_id=run_id).values_list("id", flat=True))
    wait_for(
        lambda: any(a in attempts and o == "cancelled" for a, o in w.outcomes),
        10,
        "the worker to say so",
    )
    assert "failed" not in [o for a, o in w.outcomes if a in attempts], w.outcomes
    # The cancelled node did not act and nothing ran after it: one tool call for each of
    # the three ticks that finished.
    assert nodes(tool_dir).count("tick") == 4
    keys = [line.split()[0] for line in executions(tool_dir)]
    assert len(keys) == 3 and len(set(keys)) == 3


def test_a_graph_run_pauses_at_a_node_boundary_and_continue_finishes_it_without_repeats(
    worker, operator, tool_dir: Path
) -> None:
    worker(AGENTS)
    steps = 20
    run_id = loop_run(operator, steps=steps, pause=0.1)
    wait_status(run_id, "running")
    wait_for(lambda: "tick" in nodes(tool_dir), 20, "the graph to reach tick")
    services.run_pause(run_id=run_id, reason="look first", user=operator)
    wait_status(run_id, "paused", timeout=20)
    request = pending(run_id)
    assert request is not None and request.kind == "pause"
    # Paused at a node boundary: the node that was running finished, its tool call is
    # recorded, and the pause holds at the checkpoint naming the node that runs next.
    checkpoint = Checkpoint.objects.get(pk=request.checkpoint_id)
    assert checkpoint.step == "tick"
    done_before = int(checkpoint.state["values"]["n"])
    assert 0 < done_before < steps
    assert len(executions(tool_dir)) == done_before
    assert nodes(tool_dir).count("tick") == done_before
    services.run_resume(
        run_id=run_id, request_id=request.id, checkpoint_id=request.checkpoint_id, user=operator
    )
    wait_status(run_id, "succeeded", timeout=40)
    assert Run.objects.get(pk=run_id).result == {"steps": steps, "pause": 0.1, "n": steps}
    # Every tick acted once, and ran once unless its attempt's lease ran out (a worker
    # slowed by a busy machine): a lost attempt's node runs again and its act is looked
    # up, not repeated. Nothing that finished before the pause runs again after it.
    lost = RunEvent.objects.filter(run_id=run_id, type="attempt.lost").count()
    ticks = nodes(tool_dir).count("tick")
    history = list(RunEvent.objects.filter(run_id=run_id).values_list("type", flat=True))
    assert steps <= ticks <= steps + lost, history
    keys = [line.split()[0] for line in executions(tool_dir)]
    assert len(keys) == steps and len(set(keys)) == steps
