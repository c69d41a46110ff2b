"""Starting a run from the dashboard: the registry, the input form, validation, permission."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from runs.models import Run
from tests.dashboard.support import HTMX, hidden, text

pytestmark = pytest.mark.django_db


def test_it_lists_the_registry_and_renders_the_agents_input_form(
    client: Client, operator: User
) -> None:
    client.force_login(operator)
    html = client.get("/runs/new").content.decode()
    assert 'href="?agent=test-agent"' in html
    html = client.get("/runs/new?agent=test-agent").content.decode()
    assert 'name="answer/n"' in html and 'type="number"' in html
    assert hidden(html, "agent") == "test-agent"
    assert hidden(html, "idempotency_key").startswith("form-")
    assert "Start test-agent" in html


def test_it_starts_a_run_and_goes_to_it(client: Client, operator: User) -> None:
    client.force_login(operator)
    response = client.post(
        "/runs/new", {"agent": "test-agent", "idempotency_key": "s1", "answer/n": "5"}
    )
    run = Run.objects.get()
    assert response.status_code == 303 and response["Location"] == f"/runs/{run.id}/"
    assert (run.input, run.created_by, run.status) == ({"n": 5}, operator, "queued")
    assert "Run started." in client.get(response["Location"]).content.decode()


def test_it_shows_input_errors_inline_and_starts_nothing(client: Client, operator: User) -> None:
    client.force_login(operator)
    response = client.post(
        "/runs/new", {"agent": "test-agent", "idempotency_key": "s1", "answer/n": "five"}, **HTMX
    )
    assert response.status_code == 422
    body = text(response)
    assert "Check the highlighted fields. No run was started." in body
    assert "Enter a whole number." in body and 'value="five"' in body
    assert Run.objects.count() == 0


def test_it_redirects_htmx_to_the_new_run(client: Client, operator: User) -> None:
    client.force_login(operator)
    response = client.post(
        "/runs/new", {"agent": "test-agent", "idempotency_key": "s1", "answer/n": "1"}, **HTMX
    )
    assert response.status_code == 200
    assert response["HX-Redirect"] == f"/runs/{Run.objects.get().id}/"


def test_it_refuses_an_unknown_agent_and_a_missing_key(client: Client, operator: User) -> None:
    client.force_login(operator)
    response = client.post("/runs/new", {"agent": "nope", "idempotency_key": "s1"})
    assert response.status_code == 400 and "Choose an agent first." in text(response)
    response = client.post("/runs/new", {"agent": "test-agent", "answer/n": "1"})
    assert response.status_code == 400 and "This form is out of date" in text(response)
    assert Run.objects.count() == 0


def test_it_is_for_operators_only(client: Client, approver: User) -> None:
    client.force_login(approver)
    assert client.get("/runs/new").status_code == 403
    response = client.post(
        "/runs/new", {"agent": "test-agent", "idempotency_key": "s1", "answer/n": "1"}
    )
    assert response.status_code == 403
    assert Run.objects.count() == 0
    assert "Start a run" not in client.get("/runs/").content.decode()
