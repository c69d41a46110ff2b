"""Management commands: worker tokens, declared agents, and DRF tokens for scripts."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from runs.agents import agent_spec
from runs.models import DeclaredAgent, WorkerToken
from runs.tokens import hash_token
from tests.api.conftest import post

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_it_creates_a_worker_token_shown_once_and_stored_hashed() -> None:
    secret = run("workertoken", "create", "go-1").strip()
    assert secret.startswith("hpw_") and len(secret) > 40
    token = WorkerToken.objects.get(name="go-1")
    assert token.token_hash == hash_token(secret) and secret not in token.token_hash
    assert secret.startswith(token.prefix)
    assert post(bearer(secret), "/api/worker/claim", {"worker_id": "w"}).status_code == 204
    listing = run("workertoken", "list")
    assert "go-1" in listing and "active" in listing and secret not in listing


def test_it_revokes_a_worker_token() -> None:
    secret = run("workertoken", "create", "go-2").strip()
    with pytest.raises(CommandError, match="revoke it first"):
        run("workertoken", "create", "go-2")
    assert "Revoked" in run("workertoken", "revoke", "go-2")
    assert post(bearer(secret), "/api/worker/claim", {"worker_id": "w"}).status_code == 401
    assert "revoked" in run("workertoken", "list")
    with pytest.raises(CommandError, match="no active worker token"):
        run("workertoken", "revoke", "go-2")
    # The name is free again; the old secret stays dead.
    fresh = run("workertoken", "create", "go-2").strip()
    assert post(bearer(fresh), "/api/worker/claim", {"worker_id": "w"}).status_code == 204
    assert post(bearer(secret), "/api/worker/claim", {"worker_id": "w"}).status_code == 401


def test_it_refuses_a_bad_token_name() -> None:
    with pytest.raises(CommandError, match="not a valid name"):
        run("workertoken", "create", "has space")


def test_it_declares_an_agent_for_http_workers(tmp_path: Path, operator) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"ticket": "integer"}))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"max_attempts": 2, "non_retryable": ["BadTicket"]}))
    out = run(
        "agent",
        "declare",
        "go-triage",
        "--input-schema",
        str(schema),
        "--retry-policy",
        str(policy),
        "--tools",
        "webhook, email",
        "--description",
        "Ticket triage in Go",
    )
    assert "Declared" in out
    spec = agent_spec("go-triage")
    assert (spec.source, spec.tools, spec.retry_policy.max_attempts) == (
        "declared",
        ("webhook", "email"),
        2,
    )
    assert "go-triage" in run("agent", "list")
    from tests.api.conftest import client_for

    client = client_for(operator)
    assert post(client, "/api/runs", {"agent": "go-triage", "input": {}}).status_code == 422
    assert (
        post(client, "/api/runs", {"agent": "go-triage", "input": {"ticket": 1}}).status_code == 201
    )
    assert "Updated" in run("agent", "declare", "go-triage", "--description", "v2")
    assert "Removed" in run("agent", "remove", "go-triage")
    assert not DeclaredAgent.objects.exists()


def test_it_refuses_bad_declarations(tmp_path: Path) -> None:
    bad_schema = tmp_path / "bad.json"
    bad_schema.write_text(json.dumps({"type": 12}))
    with pytest.raises(CommandError, match="not valid JSON Schema"):
        run("agent", "declare", "x", "--input-schema", str(bad_schema))
    not_json = tmp_path / "nope.json"
    not_json.write_text("{")
    with pytest.raises(CommandError, match="not JSON"):
        run("agent", "declare", "x", "--input-schema", str(not_json))
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"max_tries": 2}))
    with pytest.raises(CommandError, match="unknown retry policy fields"):
        run("agent", "declare", "x", "--retry-policy", str(policy))
    with pytest.raises(CommandError, match="Python agent"):
        run("agent", "declare", "test-agent")
    with pytest.raises(CommandError, match="Cannot read"):
        run("agent", "declare", "x", "--input-schema", str(tmp_path / "missing.json"))
    assert not DeclaredAgent.objects.exists()


def test_it_lets_a_script_use_a_drf_token(operator) -> None:
    out = io.StringIO()
    call_command("drf_create_token", operator.username, stdout=out)
    key = out.getvalue().split()[2]
    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert script.get("/api/runs").status_code == 200


def test_it_shows_tokens_and_records_in_the_admin_and_revokes_there(client) -> None:
    from django.contrib.auth.models import User

    admin = User.objects.create_superuser("root", password="pw-root")
    client.force_login(admin)
    secret = run("workertoken", "create", "go-3").strip()
    token = WorkerToken.objects.get(name="go-3")
    page = client.get("/admin/runs/workertoken/")
    assert page.status_code == 200 and b"go-3" in page.content
    assert (
        token.token_hash.encode()
        not in client.get(f"/admin/runs/workertoken/{token.pk}/change/").content
    )
    assert client.get("/admin/runs/idempotencyrecord/").status_code == 200
    client.post("/admin/runs/workertoken/", {"action": "revoke", "_selected_action": [token.pk]})
    assert post(bearer(secret), "/api/worker/claim", {"worker_id": "w"}).status_code == 401
