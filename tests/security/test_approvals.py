"""Issue 13, findings 1, 2, 8 and 13: approvals that cannot be skipped or reused.

1. Pre-approving a step at start is an approval: it needs the approve permission in
   the API, the start form, ``startrun --approve`` and ``run_start`` itself, and it is
   recorded (event, report) as that person's approval.
2. An approval covers exactly the tool, target and request it showed; anything else
   in the same step needs its own approval. Long hold-point keys never collide.
8. An attempt is bound to the worker token that claimed it; writes from any other
   token are refused ``not_your_lease``; outcomes are recorded, noting the token.
13. An outcome without epochs from an attempt that no longer holds the run is late.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token

from ledger.models import SideEffect
from ledger.services import action_hash
from runs import services
from runs.errors import HoldpointError
from runs.models import Attempt, Run, RunEvent
from runtime.context import hold_point_key
from tests.api.conftest import client_for, post, worker_client
from tests.ledger import conftest as ledger_fixtures
from tests.runs.factory import AGENT, allow_preapproval, snapshot
from tests.runtime import conftest as runtime_fixtures
from tests.runtime.conftest import fresh, run_next

# Fixtures of other test folders, used here under their own names.
config_dir = ledger_fixtures.config_dir
mailbox = ledger_fixtures.mailbox
make_agent = runtime_fixtures.make_agent

PROBLEM = "application/problem+json"
AUTH_TEAM = "auth-team@example.com"
EVERYONE = "everyone@corp.example"


def mail(to: str) -> dict[str, Any]:
    return {"to": [to], "subject": "token versions changed", "body": "v2 and v3 only."}


@pytest.fixture
def ada(db: None) -> User:
    """An admin: may start runs and approve."""
    user = User.objects.create_user(username="ada", password="pw-ada")
    user.groups.add(Group.objects.get(name="admin"))
    return user


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith(PROBLEM)
    body = response.json()
    assert body["code"] == code
    return body


# --- Worker protocol over HTTP ------------------------------------------------------------------


def claim(worker: Any, worker_id: str = "w1", **body: Any) -> dict[str, Any]:
    response = post(worker, "/api/worker/claim", {"worker_id": worker_id, **body})
    assert response.status_code == 200, response.content[:300]
    return response.json()


def fenced(lease: dict[str, Any], **body: Any) -> dict[str, Any]:
    return {"lease_epoch": lease["lease_epoch"], "cancel_epoch": lease["cancel_epoch"], **body}


def attempt_url(lease: dict[str, Any], action: str) -> str:
    return f"/api/worker/attempts/{lease['attempt_id']}/{action}"


def begin(worker: Any, lease: dict[str, Any], **body: Any) -> Any:
    body.setdefault("step_id", "notify.email")
    body.setdefault("tool", "email")
    return post(worker, attempt_url(lease, "side-effects"), fenced(lease, **body))


def hold_for_approval(
    worker: Any, lease: dict[str, Any], *, tool: str, target: str, request: Any
) -> dict[str, Any]:
    """What a worker does on approval_required: a checkpoint and an auth_required hold point
    showing the action."""
    saved = post(worker, attempt_url(lease, "checkpoint"), fenced(lease, step="notify", state={}))
    assert saved.status_code == 201
    asked = post(
        worker,
        attempt_url(lease, "interrupt"),
        fenced(
            lease,
            checkpoint_id=saved.json()["checkpoint_id"],
            kind="auth_required",
            prompt=f"Send {tool} to {target}?",
            step_id="notify.email",
            action={"tool": tool, "target": target, "change": request},
        ),
    )
    assert asked.status_code == 201, asked.content[:300]
    return asked.json()


def approve(person: Any, run_id: str, request: dict[str, Any], key: str) -> None:
    response = post(
        person,
        f"/api/runs/{run_id}/resume",
        {
            "request_id": request["request_id"],
            "checkpoint_id": request["checkpoint_id"],
            "value": {"decision": "approve", "comment": f"ok for {request['request_id']}"},
        },
        key=key,
    )
    assert response.status_code == 202, response.content[:300]


# --- 1. Pre-approving is an approval ----------------------------------------------------------


def test_it_refuses_an_operator_who_pre_approves_over_the_api(operator: User) -> None:
    response = post(
        client_for(operator),
        "/api/runs",
        {"agent": AGENT, "input": {"n": 1}, "approvals": ["approve.approve-v1", "notify.email"]},
        key="pre-1",
    )
    body = assert_problem(response, 403, "preapproval_not_permitted")
    assert body["approvals"] == ["approve.approve-v1", "notify.email"]
    assert not Run.objects.exists()
    assert not RunEvent.objects.exists()
    # Without approvals the operator starts runs as before.
    plain = post(client_for(operator), "/api/runs", {"agent": AGENT, "input": {"n": 1}})
    assert plain.status_code == 201


def test_it_records_a_pre_approval_as_the_approvers_and_names_them_in_the_report(
    ada: User, viewer: User, mailbox: list[Any]
) -> None:
    allow_preapproval()  # the policy lets a starter pre-approve: here the permission decides
    started = post(
        client_for(ada),
        "/api/runs",
        {"agent": AGENT, "input": {"n": 1}, "approvals": ["notify.email"]},
        key="pre-2",
    )
    assert started.status_code == 201, started.content[:300]
    run_id = started.json()["run_id"]
    events = client_for(viewer).get(f"/api/runs/{run_id}/events").json()
    approved = [e for e in events if e["type"] == "run.approved_at_start"]
    assert len(approved) == 1
    assert approved[0]["actor"] == "user:ada"
    key = Token.objects.get(user=ada).key
    assert approved[0]["payload"] == {
        "steps": ["notify.email"],
        "by": "ada",
        # How, and with which credential (the audit trail): ada's token, never its key.
        "via": "api",
        "identity": "token:" + hashlib.sha256(key.encode()).hexdigest()[:12],
    }

    worker = worker_client("w-pre")
    lease = claim(worker)
    answer = begin(worker, lease, target=AUTH_TEAM, request=mail(AUTH_TEAM))
    assert answer.status_code == 200 and answer.json()["decision"] == "act"
    effect = SideEffect.objects.get(run_id=run_id)
    assert effect.approval["source"] == "start" and effect.approval["by"] == "ada"
    assert effect.approval["action_hash"] == action_hash(
        tool="email", target=AUTH_TEAM, request=mail(AUTH_TEAM)
    )
    report = client_for(viewer).get(f"/api/runs/{run_id}/report").json()
    rows = [row for group in report["groups"] for row in group["rows"]]
    assert [row["approved_by"] for row in rows] == ["ada"]


def test_it_refuses_a_pre_approval_in_the_service_without_the_permission(
    operator: User, approver: User
) -> None:
    allow_preapproval()  # the policy lets a starter pre-approve: here the permission decides
    for user in (operator, None):
        with pytest.raises(HoldpointError) as refused:
            services.run_start(agent=AGENT, input={"n": 1}, user=user, approvals=["notify.email"])
        assert refused.value.code == "preapproval_not_permitted"
        assert refused.value.status == 403
    assert not Run.objects.exists()
    run = services.run_start(agent=AGENT, input={"n": 1}, user=approver, approvals=["notify.email"])
    assert (run.approvals, run.created_by) == (["notify.email"], approver)


def test_it_refuses_a_pre_approval_on_the_start_form_without_the_permission(
    client: Client, operator: User, ada: User
) -> None:
    allow_preapproval()  # the policy lets a starter pre-approve: here the permission decides
    client.force_login(operator)
    page = client.get(f"/runs/new?agent={AGENT}").content.decode()
    assert 'name="approvals"' not in page  # Only people who may approve see the field.
    refused = client.post(
        "/runs/new",
        {"agent": AGENT, "idempotency_key": "f1", "answer/n": "5", "approvals": "notify.email"},
    )
    assert refused.status_code == 403
    assert not Run.objects.exists()

    client.force_login(ada)
    assert 'name="approvals"' in client.get(f"/runs/new?agent={AGENT}").content.decode()
    started = client.post(
        "/runs/new",
        {
            "agent": AGENT,
            "idempotency_key": "f2",
            "answer/n": "5",
            "approvals": "notify.email, approve.approve-v1",
        },
    )
    assert started.status_code == 303, started.content[:300]
    run = Run.objects.get()
    assert (run.approvals, run.created_by) == (["notify.email", "approve.approve-v1"], ada)
    timeline = client.get(f"/runs/{run.id}/").content.decode()
    assert "Approved at start by ada: notify.email, approve.approve-v1." in timeline


def test_it_needs_an_approver_for_startrun_approve(operator: User, ada: User) -> None:
    allow_preapproval()  # the policy lets a starter pre-approve: here the permission decides
    with pytest.raises(CommandError, match="--as"):
        call_command("startrun", AGENT, '{"n": 1}', "--approve", "notify.email")
    with pytest.raises(CommandError, match="preapproval_not_permitted"):
        call_command(
            "startrun", AGENT, '{"n": 1}', "--approve", "notify.email", "--as", operator.username
        )
    assert not Run.objects.exists()
    call_command("startrun", AGENT, '{"n": 1}', "--approve", "notify.email", "--as", "ada")
    run = Run.objects.get()
    assert (run.approvals, run.created_by) == (["notify.email"], ada)
    assert RunEvent.objects.get(run=run, type="run.approved_at_start").payload["by"] == "ada"


# --- 2. An approval covers exactly what it showed ------------------------------------------------


def test_it_binds_an_approval_to_the_tool_target_and_request(
    operator: User, approver: User, mailbox: list[Any]
) -> None:
    person = client_for(operator)
    run_id = post(person, "/api/runs", {"agent": AGENT, "input": {"n": 1}}).json()["run_id"]
    worker = worker_client("w-bind")
    lease = claim(worker)
    first = begin(worker, lease, target=AUTH_TEAM, request=mail(AUTH_TEAM))
    assert_problem(first, 409, "approval_required")
    request = hold_for_approval(
        worker, lease, tool="email", target=AUTH_TEAM, request=mail(AUTH_TEAM)
    )
    approve(client_for(approver), run_id, request, key="ap-1")
    lease = claim(worker)

    # The same step now tries to mail everyone, or to call a webhook: not what was approved.
    for other in (
        {"target": EVERYONE, "request": mail(EVERYONE)},
        {"target": AUTH_TEAM, "request": {**mail(AUTH_TEAM), "bcc": [EVERYONE]}},
        {
            "tool": "webhook",
            "target": "https://hooks.example/all",
            "request": {"url": "https://hooks.example/all", "body": {}},
        },
    ):
        refused = begin(worker, lease, **other)
        body = assert_problem(refused, 409, "approval_required")
        assert "denied_by" not in body
    assert not SideEffect.objects.exists()

    # What was approved acts, in the approver's name, with the hash of what they saw.
    acted = begin(worker, lease, target=AUTH_TEAM, request=mail(AUTH_TEAM))
    assert acted.status_code == 200 and acted.json()["decision"] == "act"
    effect = SideEffect.objects.get()
    assert (effect.approval["by"], effect.approval["request_id"]) == (
        "alice",
        request["request_id"],
    )
    assert effect.approval["action_hash"] == action_hash(
        tool="email", target=AUTH_TEAM, request=mail(AUTH_TEAM)
    )


def test_it_asks_again_in_a_new_hold_point_when_the_step_changes_what_it_does(
    make_agent: Callable[..., Any], approver: User, mailbox: list[Any]
) -> None:
    agent = make_agent()
    recipient = {"to": AUTH_TEAM}

    @agent.step
    def notify(ctx: Any, state: Any) -> Any:
        sent = ctx.side_effect("email", recipient["to"], mail(recipient["to"]))
        return ctx.done(sent.external_reference)

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    first = fresh(run).pending_request
    assert first.action["target"] == AUTH_TEAM
    services.run_resume(
        run_id=run.id,
        request_id=first.id,
        checkpoint_id=first.checkpoint_id,
        value={"decision": "approve", "comment": "auth team only"},
        user=approver,
    )
    # Between the approval and the re-run, the step decides to mail everyone instead.
    recipient["to"] = EVERYONE
    run_next(agent)
    second = fresh(run).pending_request
    assert second is not None and second.id != first.id
    assert (second.kind, second.step_id, second.action["target"]) == (
        "auth_required",
        first.step_id,
        EVERYONE,
    )
    assert mailbox == [] and not SideEffect.objects.exists()


def test_it_lets_no_other_action_take_over_an_approved_pending_effect(
    operator: User, approver: User, mailbox: list[Any]
) -> None:
    person = client_for(operator)
    run_id = post(person, "/api/runs", {"agent": AGENT, "input": {"n": 1}}).json()["run_id"]
    worker = worker_client("w-pending")
    lease = claim(worker)
    request = hold_for_approval(
        worker, lease, tool="email", target=AUTH_TEAM, request=mail(AUTH_TEAM)
    )
    approve(client_for(approver), run_id, request, key="ap-2")
    lease = claim(worker)
    acted = begin(worker, lease, target=AUTH_TEAM, request=mail(AUTH_TEAM))
    assert acted.json()["decision"] == "act"
    # The worker dies before it reports; the next attempt's step would now mail everyone.
    Attempt.objects.filter(pk=lease["attempt_id"]).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert services.leases_expire() == 1
    lease = claim(worker, "w2")
    refused = begin(worker, lease, target=EVERYONE, request=mail(EVERYONE))
    assert_problem(refused, 409, "approval_required")
    # The approved action itself is looked up, as before.
    again = begin(worker, lease, target=AUTH_TEAM, request=mail(AUTH_TEAM))
    assert again.status_code == 200 and again.json()["decision"] == "look_up"


def test_it_keeps_long_hold_point_keys_apart() -> None:
    common = "notify." + "x" * 120
    one, two = hold_point_key(common + "-one"), hold_point_key(common + "-two")
    assert one != two
    assert len(one) <= 100 and len(two) <= 100
    assert one.startswith(common[:70])
    # Keys that fit are kept as they are (runs under way keep their keys).
    assert hold_point_key("notify.email#2") == "notify.email#2"
    assert hold_point_key("s" * 100) == "s" * 100


def test_it_never_answers_one_long_key_with_the_answer_to_another(
    make_agent: Callable[..., Any], operator: User
) -> None:
    agent = make_agent()
    prefix = "k" * 120

    @agent.step
    def ask(ctx: Any, state: Any) -> Any:
        first = ctx.ask("First?", {"v": "string"}, key=prefix + "-first")
        second = ctx.ask("Second?", {"v": "string"}, key=prefix + "-second")
        return ctx.done([first["v"], second["v"]])

    run = services.run_start(agent=agent.name, input={})
    run_next(agent)
    request = fresh(run).pending_request
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=request.checkpoint_id,
        value={"v": "one"},
        user=operator,
    )
    run_next(agent)
    second = fresh(run).pending_request
    assert second is not None, "the second question was answered with the first's answer"
    assert second.prompt == "Second?" and second.step_id != request.step_id


# --- 8. A lease belongs to the token that claimed it ---------------------------------------------


def test_it_refuses_every_fenced_write_from_another_token(operator: User) -> None:
    run_id = post(client_for(operator), "/api/runs", {"agent": AGENT, "input": {"n": 1}}).json()[
        "run_id"
    ]
    owner, intruder = worker_client("owner"), worker_client("intruder")
    lease = claim(owner, "w-owner")
    checkpoint = post(owner, attempt_url(lease, "checkpoint"), fenced(lease, step="s", state={}))
    assert checkpoint.status_code == 201
    before = snapshot(run_id)
    writes = {
        "heartbeat": {"lease_epoch": lease["lease_epoch"]},
        "checkpoint": fenced(lease, step="s2", state={"x": 1}),
        "interrupt": fenced(
            lease,
            checkpoint_id=checkpoint.json()["checkpoint_id"],
            kind="input_required",
            prompt="Which?",
            accepted_schema={"v": "string"},
        ),
        "complete": fenced(lease, result={"stolen": True}),
        "fail": fenced(lease, error={"type": "Boom", "message": "x"}),
        "release": {"lease_epoch": lease["lease_epoch"], "reason": "shutdown"},
        "side-effects": fenced(
            lease,
            step_id="s",
            tool="config_store",
            target="a/b",
            request={"document": "a/b", "content": {"k": 1}},
        ),
    }
    for action, body in writes.items():
        response = post(intruder, attempt_url(lease, action), body)
        assert_problem(response, 409, "not_your_lease")
    assert snapshot(run_id) == before
    assert Attempt.objects.get(pk=lease["attempt_id"]).worker_token.name == "owner"
    # The owner's own writes go through.
    done = post(owner, attempt_url(lease, "complete"), fenced(lease, result={"ok": True}))
    assert done.status_code == 200 and done.json()["status"] == "succeeded"


def test_it_records_an_outcome_from_another_token_and_says_which_token_sent_it(
    operator: User, config_dir: Any
) -> None:
    post(client_for(operator), "/api/runs", {"agent": AGENT, "input": {"n": 1}})
    owner, intruder = worker_client("owner"), worker_client("intruder")
    lease = claim(owner, "w-owner")
    begun = begin(
        owner,
        lease,
        step_id="write",
        tool="config_store",
        target="svc/a",
        request={"document": "svc/a", "content": {"k": 1}},
    )
    assert begun.status_code == 200 and begun.json()["decision"] == "act"
    operation_id = begun.json()["operation_id"]
    reported = post(
        intruder,
        f"/api/worker/side-effects/{operation_id}/outcome",
        {"status": "confirmed", "external_reference": "v9"},
    )
    assert reported.status_code == 200  # A fact is recorded whoever reports it ...
    effect = SideEffect.objects.get(pk=operation_id)
    assert (effect.status, effect.external_reference) == ("confirmed", "v9")
    assert effect.outcome_actor == "worker-token:intruder"  # ... in the name of who sent it.
    event = RunEvent.objects.get(type="side_effect.confirmed")
    assert event.payload["worker_token"] == "intruder"
    assert event.payload["token_matches_lease"] is False


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_lets_only_the_claiming_token_complete_when_two_tokens_race() -> None:
    services.run_start(agent=AGENT, input={"n": 1})
    owner, intruder = worker_client("owner"), worker_client("intruder")
    lease = claim(owner, "w-owner")
    body = fenced(lease, result={"by": "whoever"})
    barrier = threading.Barrier(2)
    results: dict[str, Any] = {}

    def complete(name: str, worker: Any) -> None:
        try:
            barrier.wait(timeout=10)
            results[name] = post(worker, attempt_url(lease, "complete"), body)
        except BaseException as exc:  # pragma: no cover - surfaced below
            results[name] = exc
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=complete, args=("owner", owner)),
        threading.Thread(target=complete, args=("intruder", intruder)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results["owner"].status_code == 200, results["owner"].content[:300]
    assert_problem(results["intruder"], 409, "not_your_lease")
    assert RunEvent.objects.filter(type="run.succeeded").count() == 1
    assert Run.objects.get().status == "succeeded"


# --- 13. Late outcomes without epochs -------------------------------------------------------------


def test_it_flags_an_outcome_without_epochs_from_a_replaced_attempt_late(
    operator: User, config_dir: Any
) -> None:
    post(client_for(operator), "/api/runs", {"agent": AGENT, "input": {"n": 1}})
    worker = worker_client("w-late")
    lease = claim(worker, "w-1")
    # While the attempt holds the run, its report without epochs is not late.
    live = begin(
        worker,
        lease,
        step_id="seed",
        tool="config_store",
        target="svc/a",
        request={"document": "svc/a", "content": {"k": 1}},
    )
    on_time = post(
        worker,
        f"/api/worker/side-effects/{live.json()['operation_id']}/outcome",
        {"status": "confirmed", "external_reference": "v1"},
    )
    assert on_time.status_code == 200 and on_time.json()["late"] is False
    begun = begin(
        worker,
        lease,
        step_id="write",
        tool="config_store",
        target="svc/b",
        request={"document": "svc/b", "content": {"k": 2}},
    )
    operation_id = begun.json()["operation_id"]
    # Its lease is lost; another attempt takes the run.
    Attempt.objects.filter(pk=lease["attempt_id"]).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert services.leases_expire() == 1
    replacement = claim(worker, "w-2")
    assert replacement["attempt_id"] != lease["attempt_id"]

    reported = post(
        worker,
        f"/api/worker/side-effects/{operation_id}/outcome",
        {"status": "confirmed", "external_reference": "v1"},
    )
    assert reported.status_code == 200
    assert reported.json()["late"] is True
    assert SideEffect.objects.get(pk=operation_id).late is True
    assert RunEvent.objects.filter(type="side_effect.late_outcome").count() == 1
