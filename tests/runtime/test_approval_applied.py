"""What people approved either happens, or the run stops where they can see it and they are
told why (issue 24, points 4 and 5): the demo's own 2-of-2 run with the config store moved
under a pending, edited approval; a superseded approval's note on the re-asked card; an
edit the agent refuses, asked again with the reason.
"""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from ledger.selectors import report_for_run
from ledger.tools.config_store import ConfigStore, ConfigStoreTool
from runs import services
from runs.approval_notes import note_text
from runs.approvals import parse_policy
from runs.errors import HoldpointError
from runs.models import AgentApprovalPolicy, Attempt, InputRequest, Notification, Run
from runs.schemas import compile_schema
from runtime.demo_agents.auth_token_migration import DOCUMENT, agent
from runtime.executor import Outcome
from runtime.sdk import Context, EditRefused, Next
from runtime.testing import HarnessError, run_agent
from tests.api.conftest import client_for, post
from tests.conftest import _user
from tests.dashboard.support import answer as answer_card
from tests.dashboard.support import card_html, text
from tests.runtime.conftest import fresh, run_next

pytestmark = pytest.mark.django_db


@pytest.fixture
def store(settings, tmp_path) -> ConfigStore:
    settings.HOLDPOINT_CONFIG_STORE_DIR = tmp_path / "config-store"
    return ConfigStore(settings.HOLDPOINT_CONFIG_STORE_DIR)


@pytest.fixture
def team() -> tuple[User, User]:
    """Two approvers with addresses; the demo's approvals need both (2 of 2)."""
    alice, bob = _user("alice", "approver"), _user("bob", "approver")
    for person in (alice, bob):
        person.email = f"{person.username}@example.com"
        person.save(update_fields=["email"])
    AgentApprovalPolicy.objects.create(agent=agent.name, policy=parse_policy({"required": 2}))
    return alice, bob


def pending(run: Run) -> InputRequest:
    request = fresh(run).pending_request
    assert request is not None, f"run {run.id} is {fresh(run).status}, not waiting"
    return request


def decide(run: Run, value: Any, user: Any = None) -> None:
    request = pending(run)
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=request.checkpoint_id,
        value=value,
        user=user,
    )


def waiting_for_the_second_approval(
    store: ConfigStore, team: tuple[User, User]
) -> tuple[Run, InputRequest]:
    """The demo run at its 2-of-2 approval of ``v1 v2`` (from ``v1 v2 v3``), which alice
    approved with an edit (keep only ``v1``): bob's approval is the one that answers it."""
    alice, _bob = team
    run = services.run_start(agent=agent.name, input={"notify": "auth-team@example.com"})
    assert run_next(agent) == Outcome.INTERRUPTED
    decide(run, {"versions": ["v1", "v2"]})
    assert run_next(agent) == Outcome.INTERRUPTED
    approval = pending(run)
    assert approval.step_id == "approve.approve-v1"
    decide(run, {"decision": "approve", "edited": {"accepted_versions": ["v1"]}}, alice)
    assert fresh(run).status == "auth_required"  # 1 of 2
    return run, approval


def move_the_config(store: ConfigStore, **changes: Any) -> None:
    """Someone else writes a new version of the document while the approval waits."""
    current = store.read(DOCUMENT)
    assert current is not None
    store.write(DOCUMENT, {**current.content, **changes}, idempotency_key="by-hand")


# --- The config store moved under the approval: the run does not succeed ---------------------


def test_an_approved_edit_that_cannot_be_applied_fails_the_run_and_says_why(
    store, team, client: Client
) -> None:
    alice, bob = team
    run, approval = waiting_for_the_second_approval(store, team)
    # Another team narrowed the config to exactly the plan: the plan is empty now, and the
    # edit alice and bob approve (keep only v1) would be dropped without a word.
    move_the_config(store, accepted_versions=["v1", "v2"])
    decide(run, {"decision": "approve"}, bob)
    assert fresh(run).status == "queued"

    assert run_next(agent) == Outcome.FAILED
    run = fresh(run)
    assert (run.status, run.failure_class) == ("failed", "deterministic")
    detail = run.failure_detail
    assert "update_auth_config on staging/auth/config" in detail
    assert "alice and bob" in detail and "not applied" in detail
    assert "accepted_versions: v1" in detail  # the edit that was approved
    assert "config changed while the approval waited" in detail
    assert "retry to plan again" in detail
    failed = Attempt.objects.get(run=run, status="failed")
    assert failed.error_type == "ApprovalNotApplied"
    # Nothing was written: the store holds the other team's version, as they left it.
    assert store.read(DOCUMENT).version == 2
    assert store.read(DOCUMENT).content["accepted_versions"] == ["v1", "v2"]

    # The report says the approved change did not happen.
    report = report_for_run(run.id)
    [row] = report["not_applied"]
    assert row["request_id"] == approval.id
    assert row["approved_by"] == ["alice", "bob"]
    assert row["edited"] == {"accepted_versions": ["v1"]}
    assert row["asked_again"] is None
    assert "config changed while the approval waited" in row["reason"]

    # The report's page and API say it too.
    client.force_login(alice)
    page = " ".join(
        re.sub(r"<[^>]+>", "", text(client.get(f"/side-effects/runs/{run.id}/"))).split()
    )
    assert "Approved, did not happen 1" in page
    assert "update_auth_config on staging/auth/config · approved by alice, bob" in page
    assert "Nothing was done for it; the run stopped." in page
    api = client_for(alice).get(f"/api/runs/{run.id}/report").json()
    assert api["not_applied"][0]["approved_by"] == ["alice", "bob"]
    assert api["not_applied"][0]["asked_again"] is None

    # The approvers are told, in the failing transaction (the outbox).
    told = Notification.objects.filter(request=approval, kind="not_applied")
    assert sorted(n.user.username for n in told) == ["alice", "bob"]
    assert {n.channel for n in told} == {"email"}
    # The sweep sends them, though the request is no longer pending: what became of it.
    from django.core import mail

    from ledger.notifications import notifications_send

    mail.outbox.clear()
    notifications_send()
    assert sorted(m.to[0] for m in mail.outbox) == sorted([alice.email, bob.email])
    for message in mail.outbox:
        assert message.subject.startswith("[Holdpoint] Not applied: Approve update_auth_config")
        assert "What you approved was not done." in message.body
        assert "config changed while the approval waited" in message.body
        assert "Time left" not in message.body
    assert set(
        Notification.objects.filter(kind="not_applied").values_list("status", flat=True)
    ) == {"sent"}


def test_a_worker_lost_after_the_approval_hands_it_to_the_next_attempt(store, team) -> None:
    """The attempt resumed with the approval loses its worker before the step ends (no
    checkpoint past it). The next attempt, from the same checkpoint, carries the same
    approval: the step must use it there, or stop as above, never succeed without it."""
    from runs.services import leases_expire
    from tests.runtime.conftest import claim, expire_lease

    _alice, bob = team
    run, approval = waiting_for_the_second_approval(store, team)
    move_the_config(store, accepted_versions=["v1", "v2"])
    decide(run, {"decision": "approve"}, bob)
    lost = claim(agent)  # its worker dies here, before the step runs
    assert lost.resume_request and lost.resume_request["request_id"] == approval.id
    expire_lease(run.id)
    leases_expire()
    nxt = Attempt.objects.get(run=run, status="queued")
    assert (nxt.reason, nxt.resume_request_id) == ("lease_expired", approval.id)
    assert run_next(agent) == Outcome.FAILED
    assert Attempt.objects.get(pk=nxt.pk).error_type == "ApprovalNotApplied"
    assert fresh(run).status == "failed"


def test_a_moved_target_asks_again_and_the_new_card_says_the_edit_was_not_applied(
    store, team, client: Client
) -> None:
    alice, bob = team
    run, approval = waiting_for_the_second_approval(store, team)
    move_the_config(store, issuer="https://auth2.staging.example")
    decide(run, {"decision": "approve"}, bob)

    assert run_next(agent) == Outcome.INTERRUPTED
    again = pending(run)
    assert again.step_id == "approve.approve-v2" and again.id != approval.id
    note = again.context["superseded_approval"]
    assert note["request_id"] == approval.id
    assert note["approved_by"] == ["alice", "bob"]
    assert note["edited"] == {"accepted_versions": ["v1"]}
    assert "config changed while the approval waited" in note["reason"]
    assert not Notification.objects.filter(kind="not_applied").exists()

    # The card says so, for the people who decide it now.
    client.force_login(alice)
    card = card_html(client.get(f"/runs/{run.id}/").content.decode(), again.id)
    assert "data-not-applied" in card
    words = " ".join(re.sub(r"<[^>]+>", "", card).split())
    assert "Asked again after alice and bob approved: config changed while" in words
    assert "Their edit (accepted_versions: v1) was not applied." in words
    # The note is shown once, as a sentence, not again among the agent's context.
    assert "superseded_approval" not in card

    # The new request's notification says why it is asked again.
    from django.core import mail

    from ledger.notifications import notifications_send

    mail.outbox.clear()
    notifications_send()
    asked = [m for m in mail.outbox if "Asked again after alice and bob approved" in m.body]
    assert asked, [m.body for m in mail.outbox]

    # The same words in plain text, for a notification of the new request.
    assert note_text(again.context).startswith(
        "Asked again after alice and bob approved: config changed while the approval waited "
        "(version: 1 → 2); the planned change is different now. Their edit (accepted_versions: "
        "v1) was not applied."
    )

    # The report lists the earlier approval as not applied, and where it was asked again.
    [row] = report_for_run(run.id)["not_applied"]
    assert (row["request_id"], row["asked_again"]) == (approval.id, again.id)


# --- An edit the agent refuses is asked again, with the reason ------------------------------

LEGACY_EDITABLE = {"accepted_versions": "string[]"}  # as asked before the enum


def test_an_edit_the_agent_refuses_is_asked_again_with_the_reason(make_agent) -> None:
    refusing = make_agent()
    seen: list[Any] = []

    @refusing.step("approve", start=True)
    def approve(ctx: Context, state: dict[str, Any]) -> Next:
        approval = ctx.approve(
            "update_auth_config",
            DOCUMENT,
            {"accepted_versions": {"from": ["v1", "v2", "v3"], "to": ["v2", "v3"]}},
            tool="config_store",
            editable=LEGACY_EDITABLE,
            arguments={"accepted_versions": ["v2", "v3"]},
        )
        seen.append(approval.edited)
        if approval.edited and "v9" in approval.edited["accepted_versions"]:
            raise EditRefused("the config has no token version v9")
        return ctx.next("done", {"keep": (approval.edited or {}).get("accepted_versions")})

    @refusing.step("done")
    def done(ctx: Context, state: dict[str, Any]) -> Any:
        return ctx.done(state)

    approver = _user("carol", "approver")
    run = services.run_start(agent=refusing.name, input={})
    assert run_next(refusing) == Outcome.INTERRUPTED
    first = pending(run)
    decide(run, {"decision": "approve", "edited": {"accepted_versions": ["v9"]}}, approver)

    assert run_next(refusing) == Outcome.INTERRUPTED
    again = pending(run)
    assert again.id != first.id
    # The same approval: the same hold point, the same plan, on the same checkpoint.
    assert (again.step_id, again.checkpoint_id) == (first.step_id, first.checkpoint_id)
    assert again.action["change"] == first.action["change"]
    assert again.action["editable"]["value"] == {"accepted_versions": ["v2", "v3"]}
    refused = again.context["refused_edit"]
    assert refused["request_id"] == first.id
    assert refused["approved_by"] == ["carol"]
    assert refused["edited"] == {"accepted_versions": ["v9"]}
    assert refused["reason"] == "the config has no token version v9"

    decide(run, {"decision": "approve"}, approver)
    assert run_next(refusing) == Outcome.SUCCEEDED
    assert fresh(run).result == {"keep": None}
    assert seen == [{"accepted_versions": ["v9"]}, None]


def test_refusing_without_an_approved_edit_fails_the_attempt(make_agent) -> None:
    careless = make_agent()

    @careless.step("go", start=True)
    def go(ctx: Context, state: dict[str, Any]) -> Next:
        raise EditRefused("nothing was edited")

    run = services.run_start(agent=careless.name, input={})
    assert run_next(careless) == Outcome.FAILED
    run = fresh(run)
    assert run.failure_class == "deterministic"
    assert "no approved edit" in run.failure_detail


# --- The demo's edit form names the versions the config has (point 5) -----------------------


def at_the_demo_approval(store: ConfigStore, keep: list[str]) -> tuple[Run, InputRequest]:
    run = services.run_start(agent=agent.name, input={"notify": "auth-team@example.com"})
    assert run_next(agent) == Outcome.INTERRUPTED
    decide(run, {"versions": keep})
    assert run_next(agent) == Outcome.INTERRUPTED
    return run, pending(run)


def test_the_demo_edit_names_the_config_versions_and_refuses_others_at_every_door(
    store, client: Client
) -> None:
    approver = _user("carol", "approver")
    run, approval = at_the_demo_approval(store, ["v2", "v3"])
    schema = approval.action["editable"]["schema"]["properties"]["accepted_versions"]
    assert schema["items"]["enum"] == ["v1", "v2", "v3"]
    assert (schema["uniqueItems"], schema["minItems"]) == (True, 1)

    # The service (every door's): a typo is refused with a pointer, and nothing is recorded.
    with pytest.raises(HoldpointError) as refused:
        decide(run, {"decision": "approve", "edited": {"accepted_versions": ["v9"]}}, approver)
    assert refused.value.code == "invalid_input"
    assert [e["pointer"] for e in refused.value.extra["errors"]] == ["/edited/accepted_versions/0"]
    # The API says the same.
    response = post(
        client_for(approver),
        f"/api/runs/{run.id}/resume",
        {
            "request_id": approval.id,
            "checkpoint_id": approval.checkpoint_id,
            "value": {"decision": "approve", "edited": {"accepted_versions": ["v3", "v3"]}},
        },
        key="dup-edit",
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["pointer"] == "/value/edited/accepted_versions"

    # The card: one checkbox per version the config has, the plan ticked.
    client.force_login(approver)
    card = card_html(client.get("/").content.decode(), approval.id)
    boxes = re.findall(r'<input type="checkbox" name="[^"]*accepted_versions"[^>]*>', card)
    assert len(boxes) == 3
    assert [("checked" in b) for b in boxes] == [False, True, True]
    # A value the form did not offer is refused next to the field, the choices kept.
    name = re.search(r'name="([^"]*accepted_versions)"', card).group(1)  # type: ignore[union-attr]
    reply = answer_card(client, approval, [("decision", "approve"), (name, "0"), (name, "v9")])
    refused_card = card_html(text(reply), approval.id)
    assert "Choose among the options." in refused_card
    assert "Nothing was sent to the run." in refused_card
    ticked = re.findall(r'<input type="checkbox" name="[^"]*accepted_versions"[^>]*>', refused_card)
    assert [("checked" in b) for b in ticked] == [True, False, False]
    assert fresh(run).status == "auth_required" and not approval.votes.exists()


def test_an_edit_approved_before_the_form_named_the_versions_is_refused_and_asked_again(
    store, client: Client
) -> None:
    approver = _user("carol", "approver")
    run, approval = at_the_demo_approval(store, ["v2", "v3"])
    # A request asked before the demo's form named the versions: any text was accepted.
    legacy = compile_schema({"accepted_versions": "string[]"})
    InputRequest.objects.filter(pk=approval.pk).update(
        action={**approval.action, "editable": {**approval.action["editable"], "schema": legacy}}
    )
    decide(run, {"decision": "approve", "edited": {"accepted_versions": ["v9"]}}, approver)

    assert run_next(agent) == Outcome.INTERRUPTED
    again = pending(run)
    assert (again.step_id, again.id != approval.id) == (approval.step_id, True)
    assert again.action["change"] == approval.action["change"]
    refused = again.context["refused_edit"]
    assert refused["approved_by"] == ["carol"]
    assert refused["edited"] == {"accepted_versions": ["v9"]}
    assert refused["reason"] == f"{DOCUMENT} v1 has no token version v9 (it has v1, v2, v3)"
    assert store.read(DOCUMENT).version == 1  # nothing was written

    client.force_login(approver)
    card = card_html(client.get(f"/runs/{run.id}/").content.decode(), again.id)
    words = " ".join(re.sub(r"<[^>]+>", "", html.unescape(card)).split())
    assert (
        "Asked again: the agent could not use the edit carol approved (accepted_versions: v9): "
        f"{DOCUMENT} v1 has no token version v9" in words
    )
    [row] = report_for_run(run.id)["not_applied"]
    assert (row["request_id"], row["asked_again"], row["refused"]) == (approval.id, again.id, True)

    decide(run, {"decision": "approve", "edited": {"accepted_versions": ["v3"]}}, approver)
    assert run_next(agent) == Outcome.INTERRUPTED  # the e-mail asks next
    assert store.read(DOCUMENT).content["accepted_versions"] == ["v3"]


# --- The harness (runtime.testing): the same rule, in memory --------------------------------


def moving_source(*versions: int) -> Any:
    """A volatile read that gives ``versions`` one per read, then the last one forever."""
    seen = list(versions)

    def read() -> dict[str, Any]:
        return {"version": seen.pop(0) if len(seen) > 1 else seen[0]}

    return read


def planner(make_agent: Any, read: Any, *, empty_after_move: bool = False) -> Any:
    """An agent that asks approval of a change planned on a versioned config, keyed by its
    version (as the demo does), and notes what it did with it."""
    made = make_agent()

    @made.step("approve", start=True)
    def approve(ctx: Context, state: dict[str, Any]) -> Next:
        config = ctx.observe("config", read)
        before = ["v1", "v2"] if empty_after_move and config["version"] > 5 else ["v1", "v2", "v3"]
        approval = ctx.approve(
            "update_auth_config",
            DOCUMENT,
            {"accepted_versions": {"from": before, "to": ["v1", "v2"]}},
            tool="config_store",
            key=f"approve-v{config['version']}",
            editable={"accepted_versions": "string[]"},
            arguments={"accepted_versions": ["v1", "v2"]},
        )
        if approval.unchanged:
            return ctx.next("done", {"changed": False})
        if approval.edited and "v9" in approval.edited["accepted_versions"]:
            raise EditRefused("the config has no token version v9")
        return ctx.next("done", {"changed": True, "edited": approval.edited})

    @made.step("done")
    def done(ctx: Context, state: dict[str, Any]) -> Any:
        return ctx.done(state)

    return made


EDITED = {"decision": "approve", "edited": {"accepted_versions": ["v1"]}}


def test_the_harness_asks_again_with_the_note_when_the_target_moved(make_agent) -> None:
    run = run_agent(planner(make_agent, moving_source(5, 6)), approvals=[EDITED, "approve"])
    assert run.status == "succeeded", run.error
    first, again = run.questions
    assert (first.key, again.key) == ("approve.approve-v5", "approve.approve-v6")
    note = again.context["superseded_approval"]
    assert note["approved_by"] == ["tester"]
    assert note["edited"] == {"accepted_versions": ["v1"]}
    assert note["reason"] == (
        "config changed while the approval waited (version: 5 → 6); "
        "the step asked again under a new key (approve.approve-v6)"
    )
    assert "superseded_approval" not in first.context


def test_the_harness_fails_a_step_that_skips_what_people_approved(make_agent) -> None:
    agent_ = planner(make_agent, moving_source(5, 6), empty_after_move=True)
    run = run_agent(agent_, approvals=[EDITED])
    assert (run.status, run.failure_class, run.error["type"]) == (
        "failed",
        "deterministic",
        "ApprovalNotApplied",
    )
    assert run.error["message"].startswith(
        "update_auth_config on staging/auth/config, approved by tester with their edit "
        "(accepted_versions: v1), was not applied: config changed while the approval waited "
        "(version: 5 → 6); the planned change is empty now"
    )
    assert run.result is None


def test_the_harness_asks_a_refused_edit_again_with_the_reason(make_agent) -> None:
    refused_edit = {"decision": "approve", "edited": {"accepted_versions": ["v9"]}}
    run = run_agent(planner(make_agent, moving_source(5)), approvals=[refused_edit, "approve"])
    assert run.status == "succeeded", run.error
    first, again = run.questions
    assert again.key == first.key and again.action == first.action
    assert again.context["refused_edit"]["reason"] == "the config has no token version v9"
    assert again.context["refused_edit"]["edited"] == {"accepted_versions": ["v9"]}
    assert run.result == {"changed": True, "edited": None}


def test_the_harness_refuses_an_edit_outside_the_demo_form(store_tool) -> None:
    with pytest.raises(HarnessError, match="/edited/accepted_versions/0"):
        run_agent(
            agent,
            {"notify": "auth-team@example.com"},
            answers=[{"versions": ["v2", "v3"]}],
            approvals=[{"decision": "approve", "edited": {"accepted_versions": ["v9"]}}],
            tools={"config_store": store_tool},
        )


@pytest.fixture
def store_tool(settings, tmp_path) -> ConfigStoreTool:
    settings.HOLDPOINT_CONFIG_STORE_DIR = tmp_path / "config-store"
    return ConfigStoreTool(root=settings.HOLDPOINT_CONFIG_STORE_DIR)


def test_a_question_asked_instead_of_the_approval_carries_the_note_too(make_agent) -> None:
    made = make_agent()
    read = moving_source(5, 6)

    @made.step("approve", start=True)
    def approve(ctx: Context, state: dict[str, Any]) -> Any:
        config = ctx.observe("config", read)
        if config["version"] > 5:
            # The agent would rather ask a person what to do now than approve again.
            ctx.ask("The config moved; go on?", {"go": "boolean"})
            return ctx.done({})
        ctx.approve("update_auth_config", DOCUMENT, {"to": "v2"}, key="change")
        return ctx.done({})

    run = run_agent(made, approvals=["approve"])
    assert run.status == "input_required"
    note = run.pending.context["superseded_approval"]  # type: ignore[union-attr]
    assert note["reason"] == (
        "config changed while the approval waited (version: 5 → 6); "
        "the step asked a new question instead"
    )
