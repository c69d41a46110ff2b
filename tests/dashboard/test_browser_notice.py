"""``GET /inbox/newest``: what a browser notification says (issue 24, point 14b). The newest
request this person may act on now, what is asked and the run's label as one short line
each, and the link of its card; the browser side is tests/browser/test_notifications.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs import services
from runs.approvals import parse_policy
from runs.models import AgentApprovalPolicy
from tests.conftest import _user
from tests.dashboard.support import ask
from tests.runs.factory import AGENT

pytestmark = pytest.mark.django_db


def test_it_says_the_newest_request_as_one_line_with_the_link_of_its_card(
    client: Client, approver: User
) -> None:
    ask(kind="input_required", prompt="An older question")
    run, _lease, _cp, req = ask(
        kind="auth_required",
        action={
            "tool": "config_store",
            "action": "update_auth_config",
            "target": "prod\r\n<!channel>\u202e",
        },
    )
    client.force_login(approver)
    response = client.get("/inbox/newest")
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    assert response.json() == {
        "request_id": req.id,
        "title": "Update prod <!channel> via update_auth_config",
        "body": run.label,
        "url": f"/runs/{run.id}/#request-{req.id}",
    }


def test_it_skips_what_this_person_may_not_decide_now(client: Client, approver: User) -> None:
    question = ask(kind="input_required", prompt="Which versions?")[3]
    AgentApprovalPolicy.objects.create(agent=AGENT, policy=parse_policy({"required": 2}))
    _run, _lease, cp, req = ask(kind="auth_required")
    services.run_resume(
        run_id=req.run_id,
        request_id=req.id,
        checkpoint_id=cp.id,
        value={"decision": "approve"},
        user=approver,
    )
    client.force_login(approver)
    # She approved already: the approval waits for someone else, the question for her.
    assert client.get("/inbox/newest").json()["request_id"] == question.id


def test_nothing_to_say_is_204_and_who_may_see_no_runs_gets_403(
    client: Client, viewer: User, approver: User
) -> None:
    ask(kind="auth_required")
    client.force_login(viewer)  # may look, may not decide
    assert client.get("/inbox/newest").status_code == 204
    outsider: Any = _user("oscar", None)
    client.force_login(outsider)
    assert client.get("/inbox/newest").status_code == 403


def test_it_needs_a_session_and_a_get(client: Client, approver: User) -> None:
    response = client.get("/inbox/newest")
    assert response.status_code == 302 and "/login/" in response["Location"]
    client.force_login(approver)
    assert client.post("/inbox/newest").status_code == 405
