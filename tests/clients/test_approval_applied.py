"""The Python client keeps the approval rule of issue 24 against a live server: an attempt
resumed with an approval uses it, or asks anew with a note saying why it was not applied,
or fails ``ApprovalNotApplied`` (and the approvers are told); ``EditRefused`` asks the
same approval again with the reason. The same agent as the in-process tests
(tests/runtime/test_approval_applied.py), written against ``holdpoint_client`` only.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from holdpoint_client import Agent, Context, Done, EditRefused, RetryPolicy

from runs import services
from runs.models import Attempt, Notification, Run
from tests.clients.conftest import answer, wait_pending, wait_status

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.django_db(transaction=True)]

DOCUMENT = "staging/auth/config"


def _config_version() -> int:
    path = Path(os.environ["HOLDPOINT_TEST_TOOL_DIR"]) / "config-version"
    return int(path.read_text()) if path.exists() else 1


planner = Agent(
    name="remote-approval-applied",
    description="Asks approval of a change planned on a versioned config, keyed by version",
    retry=RetryPolicy(max_attempts=2, backoff_initial=0.1, backoff_max=0.5),
)


@planner.step(start=True)
def approve(ctx: Context, state: dict[str, Any]) -> Done:
    version = ctx.observe("config", _config_version)
    # From version 3 on, the config already accepts exactly the plan: nothing to change.
    before = ["v1", "v2"] if version >= 3 else ["v1", "v2", "v3"]
    approval = ctx.approve(
        "update_auth_config",
        DOCUMENT,
        {"accepted_versions": {"from": before, "to": ["v1", "v2"]}},
        key=f"approve-v{version}",
        editable={"accepted_versions": "string[]"},
        arguments={"accepted_versions": ["v1", "v2"]},
    )
    if approval.unchanged:
        return ctx.done({"changed": False})
    if approval.edited and "v9" in approval.edited["accepted_versions"]:
        raise EditRefused("the config has no token version v9")
    return ctx.done({"changed": True, "edited": approval.edited})


EDITED = {"decision": "approve", "edited": {"accepted_versions": ["v1"]}}


@pytest.fixture
def started(worker, operator, approver) -> str:
    approver.email = "alice@example.com"
    approver.save(update_fields=["email"])
    worker(agents=[planner])
    return services.run_start(agent=planner.name, input={}, user=operator).id


def test_a_moved_target_asks_again_with_a_note_naming_the_approval(
    started: str, approver, tool_dir: Path
) -> None:
    first = wait_pending(started, "auth_required")
    assert first.step_id == "approve.approve-v1"
    (tool_dir / "config-version").write_text("2")  # It moves while the approval waits.
    answer(started, first, EDITED, approver)

    again = wait_pending(started, "auth_required")
    assert again.step_id == "approve.approve-v2"
    note = again.context["superseded_approval"]
    assert (note["request_id"], note["approved_by"]) == (first.id, ["alice"])
    assert note["edited"] == {"accepted_versions": ["v1"]}
    assert note["reason"] == (
        "config changed while the approval waited (1 → 2); "
        "the step asked again under a new key (approve.approve-v2)"
    )
    answer(started, again, {"decision": "approve"}, approver)
    wait_status(started, "succeeded")
    assert Run.objects.get(pk=started).result == {"changed": True, "edited": None}


def test_a_step_that_skips_what_people_approved_fails_and_they_are_told(
    started: str, approver, tool_dir: Path
) -> None:
    first = wait_pending(started, "auth_required")
    (tool_dir / "config-version").write_text("3")  # Now the plan changes nothing.
    answer(started, first, EDITED, approver)

    wait_status(started, "failed")
    run = Run.objects.get(pk=started)
    assert run.failure_class == "deterministic"
    assert run.failure_detail.startswith(
        "ApprovalNotApplied: update_auth_config on staging/auth/config, approved by alice "
        "with their edit (accepted_versions: v1), was not applied: config changed while the "
        "approval waited (1 → 3); the planned change is empty now"
    )
    assert Attempt.objects.get(run_id=started, status="failed").error_type == "ApprovalNotApplied"
    [told] = Notification.objects.filter(request_id=first.id, kind="not_applied")
    assert (told.user, told.channel) == (approver, "email")


def test_an_edit_the_agent_refuses_is_asked_again_with_the_reason(started: str, approver) -> None:
    first = wait_pending(started, "auth_required")
    answer(
        started, first, {"decision": "approve", "edited": {"accepted_versions": ["v9"]}}, approver
    )

    again = wait_pending(started, "auth_required")
    assert again.id != first.id
    assert (again.step_id, again.checkpoint_id) == (first.step_id, first.checkpoint_id)
    assert again.action["change"] == first.action["change"]
    refused = again.context["refused_edit"]
    assert refused["reason"] == "the config has no token version v9"
    assert (refused["approved_by"], refused["edited"]) == (["alice"], {"accepted_versions": ["v9"]})
    answer(started, again, {"decision": "approve"}, approver)
    wait_status(started, "succeeded")
    assert Run.objects.get(pk=started).result == {"changed": True, "edited": None}


# --- The TypeScript client: the same agent and cases, in Node ----------------------------------


def test_the_typescript_client_keeps_the_same_rule(live_api, tool_dir: Path) -> None:
    from django.contrib.auth.models import Group, User
    from rest_framework.authtoken.models import Token

    from runs.groups import ensure_default_groups
    from runs.tokens import worker_token_create
    from tests.clients.test_typescript_client import CLIENT, Sweeper, build

    build()
    ensure_default_groups()
    person = User.objects.create_user(username="tsstarter")
    person.groups.add(Group.objects.get(name="operator"))
    approver = User.objects.create_user(username="tsapprover", email="tsapprover@example.com")
    approver.groups.add(Group.objects.get(name="approver"))
    _, token = worker_token_create(name="ts-approvals")
    sweeper = Sweeper()
    sweeper.start()
    try:
        result = subprocess.run(
            ["node", "--test", "--test-concurrency=1", "test/approvals.test.mjs"],
            cwd=CLIENT,
            env={
                **os.environ,
                "HOLDPOINT_URL": live_api.url,
                "HOLDPOINT_TOKEN": token,
                "HOLDPOINT_USER_TOKEN": Token.objects.create(user=person).key,
                "HOLDPOINT_APPROVER_TOKEN": Token.objects.create(user=approver).key,
                "HOLDPOINT_TEST_TOOL_DIR": str(tool_dir),
            },
            capture_output=True,
            text=True,
            timeout=240,
        )
    finally:
        sweeper.stop.set()
        sweeper.join(5)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "# fail 0" in result.stdout and "# pass 3" in result.stdout
    # The failed run's approver is owed the not_applied message, as with the other runtimes.
    failed = Run.objects.get(agent="ts-approval-applied", status="failed")
    [told] = Notification.objects.filter(request__run=failed, kind="not_applied")
    assert told.user == approver
