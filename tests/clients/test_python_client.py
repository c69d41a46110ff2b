"""The Python client (clients/python, ``holdpoint_client``) against a live server process:
a remote agent asks, is answered, observes, is approved, acts exactly once through a
worker kill, can be cancelled and paused, and releases its lease at SIGTERM.

Workers run in the test process (``Worker``) or as ``holdpoint-worker`` processes; the
server is daphne in its own process (``tests/clients/conftest.py``).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from holdpoint_client import Worker

from ledger.models import SideEffect
from runs import services
from runs.models import AgentVersion, Run, RunEvent
from tests.clients.agents import AGENTS
from tests.clients.conftest import (
    LEASE,
    answer,
    executions,
    pending,
    status,
    wait_for,
    wait_pending,
    wait_status,
)

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]


def start_deploy(operator: Any) -> str:
    return services.run_start(
        agent="remote-deploy", input={"service": "auth-gateway"}, user=operator
    ).id


def test_a_remote_agent_asks_observes_is_approved_and_acts_once(
    worker, operator, approver, tool_dir: Path
) -> None:
    worker()
    version = AgentVersion.objects.get(agent="remote-deploy")
    assert version.tool_declarations[0]["name"] == "folder"
    run_id = start_deploy(operator)
    assert Run.objects.get(pk=run_id).agent_version == version.version

    asked = wait_pending(run_id, "input_required")
    assert asked.context["observed"]["config"]["value"] == 1
    (tool_dir / "config-version").write_text("2")  # It changes while the run waits.
    answer(run_id, asked, {"versions": ["v2"]}, operator)

    approval = wait_pending(run_id, "auth_required")
    assert approval.action["change"] == {"versions": {"from": [], "to": ["v2"]}}
    answer(run_id, approval, {"decision": "approve", "comment": "ok"}, approver)

    wait_status(run_id, "succeeded")
    run = Run.objects.get(pk=run_id)
    assert run.result["deployed"] is True
    assert run.result["agent_version"] == version.version  # ctx.agent_version
    assert run.result["versions"] == ["v2"]
    assert run.result["changed"] is True  # ctx.changed saw the observed value move.
    assert run.result["reference"].startswith("folder:")
    assert run.cost == pytest.approx(0.5)
    assert len(executions(tool_dir)) == 1
    types = list(RunEvent.objects.filter(run_id=run_id).values_list("type", flat=True))
    assert "agent.log" in types and "run.succeeded" in types
    logs = RunEvent.objects.filter(run_id=run_id, type="agent.log")
    assert any("changed while the run was waiting" in e.payload["message"] for e in logs)


def test_a_denial_is_a_value_the_step_acts_on(worker, operator, approver, tool_dir) -> None:
    worker()
    run_id = start_deploy(operator)
    answer(run_id, wait_pending(run_id, "input_required"), {"versions": ["v3"]}, operator)
    answer(
        run_id,
        wait_pending(run_id, "auth_required"),
        {"decision": "deny", "comment": "not now"},
        approver,
    )
    wait_status(run_id, "succeeded")
    assert Run.objects.get(pk=run_id).result == {"deployed": False, "by": "alice"}
    assert executions(tool_dir) == []


def test_an_approver_edits_the_plan_and_the_irreversible_call_runs_edited_under_its_own_key(
    worker, operator, approver, tool_dir: Path
) -> None:
    worker()
    run_id = services.run_start(agent="remote-tune", input={"service": "gateway"}, user=operator).id
    card = wait_pending(run_id, "auth_required")
    # ctx.approve(..., editable=SCHEMA, arguments=PLAN) sent the form and the plan.
    assert card.action["editable"]["value"] == {"timeout": 30, "retries": 2}
    assert card.action["editable"]["schema"]["properties"]["timeout"]["type"] == "integer"
    answer(
        run_id,
        card,
        {"decision": "approve", "edited": {"timeout": 45, "retries": 2}, "comment": "longer"},
        approver,
    )
    # The irreversible call asks with the tool's form (edit_schema), the plan prefilled.
    send = wait_pending(run_id, "auth_required")
    assert send.id != card.id
    assert send.action["change"] == {"to": "ops", "body": "timeout=45"}
    assert send.action["editable"]["value"] == {"to": "ops", "body": "timeout=45"}
    edited = {"to": "ops", "body": "timeout=45, sent at night"}
    answer(run_id, send, {"decision": "approve", "edited": edited}, approver)
    wait_status(run_id, "succeeded")
    result = Run.objects.get(pk=run_id).result
    assert result["settings"] == {"timeout": 45, "retries": 2}  # approval.edited
    assert result["edited"] is True and result["sent"] is True
    # The edited request ran, once, under its own key (not the plan's).
    [effect] = SideEffect.objects.filter(run_id=run_id)
    assert effect.request == edited
    assert effect.idempotency_key.rsplit(".", 1)[-1].startswith("e")
    [line] = executions(tool_dir)
    assert line.split()[0] == effect.idempotency_key
    [written] = [p.read_text() for p in tool_dir.glob("*.json")]
    assert "sent at night" in written


def test_send_back_with_a_comment_reaches_the_step_as_responded(
    worker, operator, approver, tool_dir: Path
) -> None:
    worker()
    run_id = services.run_start(agent="remote-tune", input={"service": "gateway"}, user=operator).id
    card = wait_pending(run_id, "auth_required")
    answer(run_id, card, {"decision": "respond", "comment": "raise retries instead"}, approver)
    wait_status(run_id, "succeeded")
    assert Run.objects.get(pk=run_id).result == {
        "responded": "raise retries instead",
        "approved": False,
    }
    assert executions(tool_dir) == []


def test_an_irreversible_call_sent_back_is_refused_with_the_comment(
    worker, operator, approver, tool_dir: Path
) -> None:
    worker()
    run_id = services.run_start(agent="remote-tune", input={"service": "gateway"}, user=operator).id
    answer(run_id, wait_pending(run_id, "auth_required"), {"decision": "approve"}, approver)
    send = wait_pending(run_id, "auth_required")
    answer(run_id, send, {"decision": "respond", "comment": "not tonight"}, approver)
    wait_status(run_id, "succeeded")
    result = Run.objects.get(pk=run_id).result
    assert result["sent"] is False and result["edited"] is False
    assert "sent back by alice: not tonight" in result["why"]
    assert executions(tool_dir) == []


def _to_the_side_effect(run_id: str, operator: Any, approver: Any) -> None:
    answer(run_id, wait_pending(run_id, "input_required"), {"versions": ["v4"]}, operator)
    answer(run_id, wait_pending(run_id, "auth_required"), {"decision": "approve"}, approver)


def test_a_worker_killed_after_the_act_does_not_act_again(
    spawn, operator, approver, tool_dir: Path
) -> None:
    # Killed after the outcome was recorded: the next attempt reuses it.
    first, _ = spawn("lingering", HOLDPOINT_TEST_LINGER="60")
    run_id = start_deploy(operator)
    _to_the_side_effect(run_id, operator, approver)
    wait_for(lambda: len(executions(tool_dir)) == 1, 30, "the act")
    wait_for(
        lambda: RunEvent.objects.filter(run_id=run_id, type="side_effect.confirmed").exists(),
        20,
        "the outcome",
    )
    first.kill()
    first.wait(10)
    spawn("second")
    wait_status(run_id, "succeeded", timeout=40)
    assert len(executions(tool_dir)) == 1
    assert Run.objects.get(pk=run_id).result["deployed"] is True


def test_a_worker_killed_between_act_and_outcome_is_looked_up_not_repeated(
    spawn, operator, approver, tool_dir: Path
) -> None:
    (tool_dir / "hang-after-execute").touch()
    first, _ = spawn("hangs")
    run_id = start_deploy(operator)
    _to_the_side_effect(run_id, operator, approver)
    wait_for(lambda: (tool_dir / "hanging").exists(), 30, "the act to hang")
    first.kill()  # The intent is pending; the world was touched; nobody said so.
    first.wait(10)
    spawn("second")
    wait_status(run_id, "succeeded", timeout=40)
    assert len(executions(tool_dir)) == 1
    types = set(RunEvent.objects.filter(run_id=run_id).values_list("type", flat=True))
    assert {"side_effect.look_up", "side_effect.confirmed"} <= types


def test_cancel_reaches_a_remote_worker_and_is_acknowledged(worker, operator) -> None:
    w = worker()
    run_id = services.run_start(agent="remote-loop", input={"pause": 0.2}, user=operator).id
    wait_status(run_id, "running")
    wait_for(
        lambda: RunEvent.objects.filter(run_id=run_id, type="checkpoint.saved").count() > 2,
        20,
        "steps",
    )
    services.run_cancel(run_id=run_id, user=operator, reason="wrong target")
    wait_status(run_id, "cancelled", timeout=20)
    wait_for(lambda: any(o == "cancelled" for _, o in w.outcomes), 10, "the worker to say so")


def test_a_cancel_reaches_a_remote_worker_long_before_its_next_heartbeat(worker, operator) -> None:
    # A 60 s lease: heartbeats every 20 s. The cancel arrives through the server's NOTIFY
    # to the worker's waiting watch, and the step unwinds at once from its sleep.
    w = worker(lease_seconds=60)
    run_id = services.run_start(agent="remote-loop", input={"pause": 30}, user=operator).id
    wait_status(run_id, "running")
    wait_for(lambda: w.active_attempts(), 10, "the worker to hold the attempt")
    threading.Event().wait(0.5)  # its watch is waiting now
    services.run_cancel(run_id=run_id, user=operator, reason="now")
    wait_status(run_id, "cancelled", timeout=10)


def test_pause_stops_a_remote_worker_at_a_step_boundary_and_continue_goes_on(
    worker, operator
) -> None:
    worker()
    run_id = services.run_start(
        agent="remote-loop", input={"pause": 0.1, "steps": 40}, user=operator
    ).id
    wait_status(run_id, "running")
    services.run_pause(run_id=run_id, reason="look first", user=operator)
    wait_status(run_id, "paused", timeout=20)
    request = pending(run_id)
    assert request is not None and request.kind == "pause"
    services.run_resume(
        run_id=run_id, request_id=request.id, checkpoint_id=request.checkpoint_id, user=operator
    )
    wait_status(run_id, "succeeded", timeout=40)
    assert Run.objects.get(pk=run_id).result == {"n": 40}


def test_sigterm_releases_the_lease_and_another_worker_goes_on(spawn, operator) -> None:
    proc, log = spawn("leaving")
    run_id = services.run_start(
        agent="remote-loop", input={"pause": 5, "steps": 2}, user=operator
    ).id
    wait_status(run_id, "running")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0, log.read_text()
    assert RunEvent.objects.filter(run_id=run_id, type="attempt.released").exists(), log.read_text()
    assert status(run_id) == "queued"
    spawn("next")
    wait_status(run_id, "succeeded", timeout=40)


def test_a_frozen_worker_never_acts_on_its_stale_lease(spawn, operator, tool_dir: Path) -> None:
    first, _ = spawn("frozen")
    run_id = services.run_start(agent="remote-wait-act", input={"wait": 4}, user=operator).id
    wait_status(run_id, "running")
    first.send_signal(signal.SIGSTOP)  # Frozen in the step, before the act.
    # Its lease runs out and is swept; another worker runs the step again and acts.
    spawn("successor")
    wait_status(run_id, "succeeded", timeout=40)
    first.send_signal(signal.SIGCONT)
    # The frozen worker wakes in its step with a lease it cannot vouch for (no renewal
    # for longer than the lease): it stops at the safe point before the act.
    time.sleep(LEASE)
    assert first.poll() is None  # It lives on, and claims again.
    [execution] = executions(tool_dir)
    assert execution.split()[1] != str(first.pid)
    assert Run.objects.get(pk=run_id).result["pid"] != first.pid
    assert (
        not RunEvent.objects.filter(run_id=run_id, actor__contains="frozen")
        .exclude(type__in=["attempt.claimed", "checkpoint.saved"])
        .exists()
    )


def test_a_lease_taken_over_is_refused_before_the_act(live_api, token, operator, tool_dir) -> None:
    """The fence, seen from the client: a step of a lease that ran out and was claimed
    again unwinds at its side effect's intent (stale_worker), and its tool never runs."""
    from holdpoint_client import Agent, Api
    from holdpoint_client.context import Context
    from holdpoint_client.control import LeaseLost
    from holdpoint_client.remote import HttpBackend, RemoteControl

    from tests.clients.agents import FolderTool

    services.agent_declare(
        name="remote-wait-act",
        actor="test",
        tools=[{"name": "folder", "reversibility": "compensable"}],
    )
    run_id = services.run_start(agent="remote-wait-act", input={}, user=operator).id
    api = Api(live_api.url, token)
    _, old = api.call("POST", "/api/worker/claim", {"worker_id": "old", "lease_seconds": 0.5})
    time.sleep(0.7)
    services.sweep_all()
    _, new = api.call("POST", "/api/worker/claim", {"worker_id": "new", "lease_seconds": 30})
    assert new["run_id"] == run_id and new["lease_epoch"] > old["lease_epoch"]

    agent = Agent(name="remote-wait-act", tools=[FolderTool()])
    control = RemoteControl(api, {**old, "lease_seconds": 30}, threading.Event())
    ctx = Context(
        backend=HttpBackend(agent, control),
        step="wait_then_act",
        checkpoint_id="",
        answers={},
        resumed=False,
    )
    with pytest.raises(LeaseLost):
        ctx.side_effect("folder", "target", {"from": "old"})
    assert executions(tool_dir) == []
    assert not SideEffect.objects.filter(run_id=run_id).exists()
    # And a lease not renewed for its length is not acted on, even before the server says so.
    control = RemoteControl(api, new, threading.Event())
    control.trusted_until -= new["lease_seconds"]
    # The same step, now with the new lease gone quiet.
    ctx = Context(
        backend=HttpBackend(agent, control),
        step="wait_then_act",
        checkpoint_id="",
        answers={},
        resumed=False,
    )
    with pytest.raises(LeaseLost):
        ctx.side_effect("folder", "target", {"from": "new"})
    assert executions(tool_dir) == []
    api.close()


def test_the_worker_reconnects_when_the_server_comes_back(
    token: str, tool_dir: Path, tmp_path: Path, operator
) -> None:
    from tests.clients.conftest import start_server, stop_server
    from tests.live.server import free_port

    port = free_port()
    services.agent_declare(name="remote-loop", actor="test", owners=["py-client"])
    w = Worker(
        f"http://127.0.0.1:{port}", token, AGENTS, lease_seconds=LEASE, wait=1.0, declare=False
    )
    w.start()  # No server yet: every claim backs off and tries again.
    try:
        run_id = services.run_start(
            agent="remote-loop", input={"pause": 0, "steps": 1}, user=operator
        ).id
        server = start_server(tmp_path, port)
        try:
            wait_status(run_id, "succeeded", timeout=40)
        finally:
            stop_server(server)
    finally:
        w.stop(grace=1)
