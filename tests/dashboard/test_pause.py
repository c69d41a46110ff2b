"""Pause on the dashboard: Pause and Continue on the run page, the Agents page and its
gate, the inbox's Paused tab; with the 403/404/405 paths."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs import services
from runs.models import AgentGate, Run
from tests.dashboard.support import HTMX, hidden, text
from tests.runs.factory import AGENT, claim, epochs, snapshot, start

pytestmark = pytest.mark.django_db


def test_an_operator_pauses_a_running_run_and_continues_it(client: Client, operator: User) -> None:
    run = start()
    lease = claim(lease_seconds=30)
    services.checkpoint_save(**epochs(lease), step="two", state={})
    client.force_login(operator)
    page = text(client.get(f"/runs/{run.id}/"))
    assert "Pause…" in page and "Cancel run…" in page
    key = hidden(page.split('action="/runs/' + run.id + '/pause"')[1], "idempotency_key")
    empty = client.post(
        f"/runs/{run.id}/pause", {"idempotency_key": key, "run_id": run.id, "reason": ""}, **HTMX
    )
    assert empty.status_code == 422 and "Say why you pause" in text(empty)
    reply = client.post(
        f"/runs/{run.id}/pause",
        {"idempotency_key": key, "run_id": run.id, "reason": "look at the diff"},
        **HTMX,
    )
    assert reply.status_code == 200
    body = text(reply)
    assert "Pause accepted" in body and 'data-pause-state="pause_requested"' in body
    # A double click is the same command.
    again = client.post(
        f"/runs/{run.id}/pause",
        {"idempotency_key": key, "run_id": run.id, "reason": "look at the diff"},
        **HTMX,
    )
    assert again.status_code == 200
    cp = services.checkpoint_save(**epochs(lease), step="three", state={})
    services.attempt_release(
        attempt_id=lease.attempt_id, lease_epoch=lease.lease_epoch, reason="paused"
    )
    page = text(client.get(f"/runs/{run.id}/"))
    assert 'data-pause-state="paused"' in page
    assert "by olivia since" in page and "before step three" in page and "look at the diff" in page
    form = page.split('action="/runs/' + run.id + '/continue"')[1]
    assert hidden(form, "checkpoint_id") == cp.id
    data = {
        "idempotency_key": hidden(form, "idempotency_key"),
        "run_id": run.id,
        "request_id": hidden(form, "request_id"),
        "checkpoint_id": cp.id,
    }
    reply = client.post(f"/runs/{run.id}/continue", data, **HTMX)
    assert reply.status_code == 200 and "Run continued" in text(reply)
    run.refresh_from_db()
    assert run.status == "queued"
    # A stale tab (the same pause, another click with a new key) is refused and told why.
    stale = client.post(f"/runs/{run.id}/continue", {**data, "idempotency_key": "other"}, **HTMX)
    assert stale.status_code == 409 and "This pause is out of date" in text(stale)


def test_a_breakpoint_shows_the_step_it_stopped_before(client: Client, operator: User) -> None:
    run = services.run_start(agent=AGENT, input={}, pause_before=["act"])
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="act", state={})
    services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="pause",
        prompt="breakpoint before act",
        context={"breakpoint": "act"},
    )
    client.force_login(operator)
    page = text(client.get(f"/runs/{run.id}/"))
    assert "breakpoint before step act" in page and "Continue" in page


def test_people_who_may_not_cancel_see_no_pause_and_cannot_post(
    client: Client, viewer: User, approver: User, outsider: User
) -> None:
    run = start()
    before = snapshot(run.id)
    for user in (viewer, approver):
        client.force_login(user)
        assert "Pause…" not in text(client.get(f"/runs/{run.id}/"))
        response = client.post(
            f"/runs/{run.id}/pause", {"idempotency_key": "k", "run_id": run.id, "reason": "x"}
        )
        assert response.status_code == 403
    client.force_login(outsider)
    assert (
        client.post(
            f"/runs/{run.id}/pause", {"idempotency_key": "k", "run_id": run.id, "reason": "x"}
        ).status_code
        == 404
    )
    client.force_login(viewer)
    assert client.get(f"/runs/{run.id}/pause").status_code == 405
    assert snapshot(run.id) == before


def test_the_agents_page_pauses_and_unpauses_with_the_confirm_text(
    client: Client, operator: User
) -> None:
    running = start()
    claim(lease_seconds=30)
    start()
    start()
    client.force_login(operator)
    page = text(client.get("/agents/"))
    assert AGENT in page and 'data-gate="open"' in page
    confirm = text(client.get(f"/agents/{AGENT}/confirm-pause"))
    assert "1 running attempts will stop at their next step; 2 queued runs will wait" in confirm
    key = hidden(confirm, "idempotency_key")
    response = client.post(f"/agents/{AGENT}/pause", {"idempotency_key": key, "reason": "INC-7"})
    assert response.status_code == 303
    gate = AgentGate.objects.get(pk=AGENT)
    assert gate.paused and gate.reason == "INC-7" and gate.actor == "user:olivia"
    page = text(client.get("/agents/"))
    assert 'data-gate="paused"' in page and "by olivia since" in page and "INC-7" in page
    assert "agent.paused" in list(running.events.values_list("type", flat=True))
    key = hidden(page.split(f'/agents/{AGENT}/unpause"')[-1], "idempotency_key")
    assert client.post(f"/agents/{AGENT}/unpause", {"idempotency_key": key}).status_code == 303
    assert not AgentGate.objects.get(pk=AGENT).paused
    assert client.get("/agents/nobody/confirm-pause").status_code == 404
    assert (
        client.post("/agents/nobody/pause", {"idempotency_key": "k", "reason": "x"}).status_code
        == 404
    )
    assert client.post(f"/agents/{AGENT}/explode", {"idempotency_key": "k"}).status_code == 404


def test_only_operators_pause_agents(client: Client, viewer: User, outsider: User) -> None:
    client.force_login(viewer)
    assert "Only operators can pause agents" in text(client.get("/agents/"))
    assert client.get(f"/agents/{AGENT}/confirm-pause").status_code == 403
    assert (
        client.post(f"/agents/{AGENT}/pause", {"idempotency_key": "k", "reason": "x"}).status_code
        == 403
    )
    client.force_login(outsider)
    assert client.get("/agents/").status_code in (403, 404)
    assert not AgentGate.objects.exists()


def test_the_paused_tab_lists_paused_runs_for_people_who_may_continue(
    client: Client, operator: User, approver: User
) -> None:
    run = start()
    services.run_pause(run_id=run.id, reason="deploy freeze", actor="user:olivia")
    client.force_login(operator)
    inbox = text(client.get("/"))
    assert "/inbox/paused" in inbox
    assert "deploy freeze" not in inbox  # a pause is not a question in the inbox
    page = text(client.get("/inbox/paused"))
    assert run.id in page and "deploy freeze" in page and "olivia" in page
    client.force_login(approver)
    assert run.id not in text(client.get("/inbox/paused"))
    assert Run.objects.get(pk=run.id).status == "paused"
