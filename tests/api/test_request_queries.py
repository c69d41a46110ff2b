"""How many statements a request spends before its view works: the token, the user and
the permission set (runs/permissions.py), and that nothing is cached across requests."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.permissions import permission_set
from runs.ratelimit import LockoutModelBackend
from tests.api.conftest import client_for
from tests.conftest import TEST_AGENT

pytestmark = pytest.mark.django_db


def _permission_queries(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in ctx.captured_queries if "auth_permission" in q["sql"]]


def test_a_token_request_reads_its_permissions_once(operator: User) -> None:
    run = services.run_start(agent=TEST_AGENT, input={"n": 1})
    client = client_for(operator)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(f"/api/runs/{run.id}")
    assert response.status_code == 200
    assert len(_permission_queries(ctx)) == 1
    if connection.vendor == "postgresql":
        # Token, user and permissions in the one statement.
        token_queries = [q for q in ctx.captured_queries if "authtoken_token" in q["sql"]]
        assert len(token_queries) == 1
        assert "auth_permission" in token_queries[0]["sql"]


def test_a_control_request_reads_its_permissions_once(operator: User) -> None:
    run = services.run_start(agent=TEST_AGENT, input={"n": 1})
    client = client_for(operator)
    with CaptureQueriesContext(connection) as ctx:
        response = client.post(
            f"/api/runs/{run.id}/cancel",
            {"reason": "x"},
            format="json",
            HTTP_IDEMPOTENCY_KEY="k-1",
        )
    assert response.status_code == 202
    assert len(_permission_queries(ctx)) == 1


def test_a_permission_taken_away_counts_from_the_next_request(operator: User) -> None:
    run = services.run_start(agent=TEST_AGENT, input={"n": 1})
    client = client_for(operator)
    assert client.get(f"/api/runs/{run.id}").status_code == 200
    operator.groups.clear()
    assert client.get(f"/api/runs/{run.id}").status_code == 404
    operator.groups.add(Group.objects.get(name="viewer"))
    assert client.get(f"/api/runs/{run.id}").status_code == 200
    # A permission given to the user directly counts as well.
    cancel = Permission.objects.get(codename="cancel_run", content_type__app_label="runs")
    response = client.post(
        f"/api/runs/{run.id}/cancel", {"reason": "x"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2"
    )
    assert response.status_code == 403
    operator.user_permissions.add(cancel)
    response = client.post(
        f"/api/runs/{run.id}/cancel", {"reason": "x"}, format="json", HTTP_IDEMPOTENCY_KEY="k-3"
    )
    assert response.status_code == 202


def test_the_permission_set_is_what_model_backend_says(operator: User, approver: User) -> None:
    from django.contrib.auth.backends import ModelBackend

    approver.user_permissions.add(
        Permission.objects.get(codename="cancel_run", content_type__app_label="runs")
    )
    superuser = User.objects.create_superuser("root", password="pw-root")
    inactive = User.objects.create_user("gone", password="pw-gone", is_active=False)
    inactive.groups.add(Group.objects.get(name="admin"))
    for user in (operator, approver, superuser, inactive):
        fresh: Any = User.objects.get(pk=user.pk)
        expected = ModelBackend().get_all_permissions(User.objects.get(pk=user.pk))
        with CaptureQueriesContext(connection) as ctx:
            assert permission_set(fresh) == expected
        assert len(ctx.captured_queries) <= 1
        # A session's user comes from the backend's get_user: user and permissions together.
        with CaptureQueriesContext(connection) as ctx:
            loaded = LockoutModelBackend().get_user(user.pk)
            if loaded is not None:
                loaded.has_perm("runs.view_run")
                loaded.has_perm("runs.cancel_run")
                assert loaded.get_all_permissions() == expected
        assert loaded is None or len(ctx.captured_queries) <= (
            3 if user.is_superuser or connection.vendor != "postgresql" else 1
        )
        assert (loaded is None) == (not user.is_active)


def test_a_session_request_reads_user_and_permissions_in_one_query(operator: User) -> None:
    run = services.run_start(agent=TEST_AGENT, input={"n": 1})
    client = Client()
    client.force_login(operator)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(f"/api/runs/{run.id}")
    assert response.status_code == 200
    assert len(_permission_queries(ctx)) == 1
