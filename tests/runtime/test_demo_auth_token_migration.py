"""The auth token migration demo, end to end in this thread: ask, approve, write, e-mail."""

from __future__ import annotations

import pytest
from django.core import mail

from ledger.models import SideEffect
from ledger.tools.config_store import ConfigStore
from runs import services
from runtime.demo_agents.auth_token_migration import DOCUMENT, agent
from runtime.executor import Outcome
from tests.runs.factory import allow_preapproval, preapprover
from tests.runtime.conftest import fresh, run_next

pytestmark = pytest.mark.django_db


@pytest.fixture
def store(settings, tmp_path) -> ConfigStore:
    settings.HOLDPOINT_CONFIG_STORE_DIR = tmp_path / "config-store"
    return ConfigStore(settings.HOLDPOINT_CONFIG_STORE_DIR)


def pending(run):
    return fresh(run).pending_request


def answer(run, value, user=None) -> None:
    request = pending(run)
    services.run_resume(
        run_id=run.id,
        request_id=request.id,
        checkpoint_id=request.checkpoint_id,
        value=value,
        user=user,
    )


def test_it_asks_approves_writes_and_notifies(store, approver) -> None:
    run = services.run_start(agent=agent.name, input={"notify": "auth-team@example.com"})
    assert run_next(agent) == Outcome.INTERRUPTED
    question = pending(run)
    assert question.prompt == "请选择需要保持兼容的 Token 版本"
    assert question.accepted_schema["properties"]["versions"]["items"] == {"type": "string"}
    assert question.context["available_versions"] == ["v1", "v2", "v3"]
    assert question.context["observed"]["config"]["value"]["version"] == 1
    assert store.read(DOCUMENT).version == 1  # the demo seeded the empty store

    answer(run, {"versions": ["v3", "v2"]})
    assert run_next(agent) == Outcome.INTERRUPTED
    approval = pending(run)
    assert (approval.kind, approval.step_id) == ("auth_required", "approve.approve-v1")
    assert approval.action["reversibility"] == "reversible"
    assert approval.action["change"]["accepted_versions"]["to"] == ["v2", "v3"]

    answer(run, {"decision": "approve", "comment": "ok"}, user=approver)
    assert run_next(agent) == Outcome.INTERRUPTED
    email = pending(run)
    # E-mail cannot be taken back: the ledger asks before it is sent.
    assert (email.kind, email.step_id) == ("auth_required", "notify.email")
    assert email.action["reversibility"] == "irreversible"
    assert store.read(DOCUMENT).content["accepted_versions"] == ["v2", "v3"]
    assert mail.outbox == []

    answer(run, {"decision": "approve"}, user=approver)
    assert run_next(agent) == Outcome.SUCCEEDED
    run = fresh(run)
    assert run.result["accepted_versions"] == ["v2", "v3"]
    assert run.result["written"] == f"{DOCUMENT}@v2"
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["auth-team@example.com"]
    effects = dict(SideEffect.objects.filter(run=run).values_list("step_id", "status"))
    assert effects == {
        "inspect.seed": "confirmed",
        "write.config_store": "confirmed",
        "notify.email": "confirmed",
    }


def test_an_edit_while_the_approval_waits_asks_again(store) -> None:
    allow_preapproval(agent.name)
    run = services.run_start(
        agent=agent.name,
        input={"notify": "a@example.com"},
        approvals=["notify.email"],
        user=preapprover(),
    )
    run_next(agent)
    answer(run, {"versions": ["v2"]})
    run_next(agent)
    assert pending(run).step_id == "approve.approve-v1"
    # Someone edits the config while the approval is pending.
    current = store.read(DOCUMENT)
    store.write(DOCUMENT, {**current.content, "issuer": "https://new"}, idempotency_key="hand-edit")
    answer(run, {"decision": "approve"})
    assert run_next(agent) == Outcome.INTERRUPTED
    again = pending(run)
    assert again.step_id == "approve.approve-v2"
    assert again.action["change"]["base_version"] == 2
    answer(run, {"decision": "approve"})
    assert run_next(agent) == Outcome.SUCCEEDED  # the e-mail was approved at start
    written = store.read(DOCUMENT)
    assert (written.version, written.content["issuer"]) == (3, "https://new")
    assert written.content["accepted_versions"] == ["v2"]


def test_a_denied_change_finishes_without_writing(store) -> None:
    run = services.run_start(agent=agent.name, input={"notify": "a@example.com"})
    run_next(agent)
    answer(run, {"versions": ["v2"]})
    run_next(agent)
    answer(run, {"decision": "deny", "comment": "freeze"})
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result == {"changed": False, "denied_by": None}
    assert store.read(DOCUMENT).version == 1


def test_an_unknown_version_stops_the_run(store) -> None:
    run = services.run_start(agent=agent.name, input={"notify": "a@example.com"})
    run_next(agent)
    answer(run, {"versions": ["v9"]})
    assert run_next(agent) == Outcome.FAILED
    run = fresh(run)
    assert (run.status, run.failure_class) == ("failed", "deterministic")
    assert "v9" in run.failure_detail


def test_an_approver_edits_the_versions_and_the_edit_is_written(store) -> None:
    allow_preapproval(agent.name)
    run = services.run_start(
        agent=agent.name,
        input={"notify": "a@example.com"},
        approvals=["notify.email"],
        user=preapprover(),
    )
    run_next(agent)
    answer(run, {"versions": ["v2", "v3"]})
    run_next(agent)
    approval = pending(run)
    assert approval.action["editable"]["value"] == {"accepted_versions": ["v2", "v3"]}
    answer(run, {"decision": "approve", "edited": {"accepted_versions": ["v3"]}})
    # The write and the e-mail (approved at start) follow in the same attempt.
    assert run_next(agent) == Outcome.SUCCEEDED
    assert fresh(run).result["accepted_versions"] == ["v3"]
    assert store.read(DOCUMENT).content["accepted_versions"] == ["v3"]


def test_a_plan_sent_back_asks_again_with_the_approvers_comment(store) -> None:
    run = services.run_start(agent=agent.name, input={"notify": "a@example.com"})
    run_next(agent)
    answer(run, {"versions": ["v2"]})
    run_next(agent)
    answer(run, {"decision": "respond", "comment": "keep v3 too"})
    assert run_next(agent) == Outcome.INTERRUPTED
    again = pending(run)
    assert again.kind == "input_required"
    assert again.context["approver_feedback"] == "keep v3 too"
    assert store.read(DOCUMENT).version == 1
