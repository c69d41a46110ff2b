"""Issue 24, point 11: a refusal tells a person who may, in words, never a permission's
codename ("You do not have the approve_run permission"); the machine ``code`` stays.

Every permission-gated door of the API and the dashboard, tried by someone who lacks the
permission: the detail (the 403 page) names no codename of any permission.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from runs import services
from tests.api.conftest import client_for
from tests.conftest import TEST_AGENT
from tests.runs.factory import interrupted

pytestmark = pytest.mark.django_db


def codenames() -> list[str]:
    return list(Permission.objects.values_list("codename", flat=True))


def in_words(text: str) -> bool:
    """No codename of any permission (approve_run, runs.approve_run, view_inputrequest …)."""
    return not any(name in text for name in codenames())


def test_every_permission_has_a_sentence_that_names_no_codename() -> None:
    from runs.selectors import PERMISSION_WORDS, permission_denied_text

    for perm, words in PERMISSION_WORDS.items():
        assert permission_denied_text(perm) == str(words)
        assert in_words(str(words)), perm
    assert in_words(permission_denied_text("runs.something_new"))


def test_the_api_refuses_in_words_and_keeps_its_code(
    viewer: User, operator: User, approver: User
) -> None:
    run, _lease, _cp, req = interrupted(kind="auth_required")
    question_run = services.run_start(agent=TEST_AGENT, input={"n": 1})
    tries: list[tuple[User, str, dict[str, Any], str]] = [
        (
            # An operator answers questions, and may not approve: the issue's own example.
            operator,
            f"/api/runs/{run.id}/resume",
            {
                "request_id": req.id,
                "checkpoint_id": req.checkpoint_id,
                "value": {"decision": "approve"},
            },
            "Only approvers can approve or deny this.",
        ),
        (
            viewer,
            "/api/runs",
            {"agent": TEST_AGENT, "input": {"n": 1}},
            "Only operators and admins can start runs.",
        ),
        (
            approver,
            f"/api/runs/{question_run.id}/cancel",
            {"reason": "x"},
            "Only operators and admins can cancel, pause or continue runs.",
        ),
        (
            approver,
            f"/api/runs/{question_run.id}/retry",
            {"reason": "x"},
            "Only operators and admins can retry runs",
        ),
        (
            approver,
            f"/api/agents/{TEST_AGENT}/pause",
            {"reason": "x"},
            "Only operators and admins can pause or unpause an agent.",
        ),
    ]
    for n, (user, path, body, words) in enumerate(tries):
        response = client_for(user).post(
            path, body, format="json", HTTP_IDEMPOTENCY_KEY=f"words-{n}"
        )
        assert response.status_code == 403, (path, response.content)
        problem = response.json()
        assert problem["code"] == "permission_denied", path
        assert words in problem["detail"], (path, problem["detail"])
        assert in_words(problem["detail"]), (path, problem["detail"])


def test_the_dashboard_refuses_in_words(client: Client, viewer: User, approver: User) -> None:
    run = services.run_start(agent=TEST_AGENT, input={"n": 1})
    client.force_login(viewer)
    page = client.post(f"/runs/{run.id}/cancel", {"reason": "x", "idempotency_key": "k"})
    assert page.status_code == 403
    assert "Only operators and admins can cancel, pause or continue runs." in page.content.decode()
    assert in_words(page.content.decode())
    client.force_login(approver)
    for response in (
        client.get(f"/agents/{TEST_AGENT}/confirm-pause"),
        client.post(f"/agents/{TEST_AGENT}/pause", {"reason": "x"}),
    ):
        assert response.status_code == 403
        body = response.content.decode()
        assert "Only operators and admins can pause or unpause an agent." in body
        assert in_words(body)
