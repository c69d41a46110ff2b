"""The ledger's HTTP endpoints: reads, reconcile, compensate and the worker routes,
with the 401/403/404/405 paths."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.tools import get_tool
from tests.api.conftest import client_for, worker_client
from tests.api.conftest import post as api_post
from tests.ledger.conftest import Receiver
from tests.ledger.helpers import hook, lose_lease, perform
from tests.runs.factory import claim, start

pytestmark = pytest.mark.django_db

CONFIG = {"document": "app", "content": {"ttl": 60}}


@pytest.fixture
def wclient(db: None) -> APIClient:
    return worker_client("ledger-worker")


def post(client: APIClient, url: str, body: Any = None, key: str | None = "k-1") -> Any:
    """POST JSON, with an Idempotency-Key unless ``key`` is None."""
    return api_post(client, url, body, key=key)


def confirmed_config(step: str = "rotate") -> tuple[Any, SideEffect]:
    run = start()
    lease = claim()
    done = perform(lease, step=step, tool="config_store", target="app", request=CONFIG)
    return run, done.side_effect


def unknown_config() -> tuple[Any, SideEffect]:
    run = start()
    lease = claim()
    op = ledger.side_effect_begin(
        attempt_id=lease.attempt_id,
        lease_epoch=lease.lease_epoch,
        cancel_epoch=lease.cancel_epoch,
        step_id="rotate",
        tool="config_store",
        target="app",
        request=CONFIG,
    ).operation_id
    return run, ledger.side_effect_record_outcome(operation_id=op, status="unknown")


# --- Reads ------------------------------------------------------------------------------------


def test_the_report_lists_groups_in_order(config_dir: Path, viewer: User) -> None:
    run, effect = confirmed_config()
    response = client_for(viewer).get(f"/api/runs/{run.id}/report")
    assert response.status_code == 200
    body = response.json()
    assert [g["key"] for g in body["groups"]] == [
        "unknown",
        "cannot_be_undone",
        "happened",
        "compensated",
        "did_not_happen",
    ]
    happened = body["groups"][2]
    assert happened["count"] == 1
    row = happened["rows"][0]
    assert row["operation_id"] == effect.operation_id
    assert row["external_reference"] == "app@v1"
    assert row["idempotency_key"] == effect.idempotency_key
    assert row["time"].endswith("Z")


def test_the_run_side_effects_are_listed(config_dir: Path, viewer: User) -> None:
    run, effect = confirmed_config()
    response = client_for(viewer).get(f"/api/runs/{run.id}/side-effects")
    assert response.status_code == 200
    assert [r["operation_id"] for r in response.json()] == [effect.operation_id]


@pytest.mark.parametrize("suffix", ["report", "side-effects"])
def test_run_reads_refuse_outsiders_strangers_and_writes(
    config_dir: Path, viewer: User, outsider: User, suffix: str
) -> None:
    run, _ = confirmed_config()
    url = f"/api/runs/{run.id}/{suffix}"
    assert client_for(None).get(url).status_code == 401
    assert client_for(outsider).get(url).status_code == 404
    assert client_for(viewer).get(f"/api/runs/run_nope/{suffix}").status_code == 404
    assert client_for(viewer).post(url, {}, format="json").status_code == 405


def test_the_reconciliation_queue_lists_unknown_effects(
    config_dir: Path, viewer: User, outsider: User
) -> None:
    confirmed_config("seed")
    _, unknown = unknown_config()
    response = client_for(viewer).get("/api/side-effects?status=needs_reconciliation")
    assert response.status_code == 200
    assert [r["operation_id"] for r in response.json()["results"]] == [unknown.operation_id]
    assert response.json()["results"][0]["needs_reconciliation"] is True
    everything = client_for(viewer).get("/api/side-effects").json()["results"]
    assert len(everything) == 2
    assert client_for(viewer).get("/api/side-effects?status=bogus").status_code == 422
    assert client_for(outsider).get("/api/side-effects").status_code == 403


def test_one_side_effect_can_be_read(config_dir: Path, viewer: User, outsider: User) -> None:
    _, effect = confirmed_config()
    url = f"/api/side-effects/{effect.operation_id}"
    assert client_for(viewer).get(url).json()["status"] == "confirmed"
    assert client_for(outsider).get(url).status_code == 404
    assert client_for(viewer).get("/api/side-effects/op_nope").status_code == 404


# --- Reconcile and compensate -----------------------------------------------------------------


def test_an_operator_reconciles_an_unknown_effect(
    config_dir: Path, operator: User, viewer: User, outsider: User
) -> None:
    _run, effect = unknown_config()
    url = f"/api/side-effects/{effect.operation_id}/reconcile"
    body = {"outcome": "confirmed", "external_reference": "app@v1", "note": "On disk."}
    assert post(client_for(outsider), url, body).status_code == 404
    assert post(client_for(viewer), url, body).status_code == 403
    assert client_for(operator).get(url).status_code == 405
    missing = post(client_for(operator), url, body, key=None)
    assert missing.status_code == 400 and missing.json()["code"] == "idempotency_key_missing"
    bad = post(client_for(operator), url, {"outcome": "maybe", "note": ""}, key="k-bad")
    assert bad.status_code == 422
    assert bad["Content-Type"] == "application/problem+json"
    assert {e["pointer"] for e in bad.json()["errors"]} == {"/outcome", "/note"}
    assert SideEffect.objects.get(pk=effect.pk).status == "unknown"
    response = post(client_for(operator), url, body)
    assert response.status_code == 200
    data = response.json()
    assert (data["status"], data["external_reference"]) == ("confirmed", "app@v1")
    assert data["resolution"]["by"] == "user:olivia" and data["resolution"]["note"] == "On disk."
    # A double click (the same key) gets the same answer back, not a second reconciliation.
    replayed = post(client_for(operator), url, body)
    assert replayed.status_code == 200 and replayed["Idempotent-Replayed"] == "true"
    assert replayed.json() == data
    again = post(client_for(operator), url, body, key="k-2")
    assert again.status_code == 409 and again.json()["code"] == "invalid_state"


def test_an_operator_compensates_a_config_write(
    config_dir: Path, operator: User, viewer: User, outsider: User
) -> None:
    _, effect = confirmed_config()
    url = f"/api/side-effects/{effect.operation_id}/compensate"
    why = {"reason": "rolled out by mistake"}
    assert post(client_for(outsider), url, why).status_code == 404
    assert post(client_for(viewer), url, why).status_code == 403
    assert client_for(operator).get(url).status_code == 405
    response = post(client_for(operator), url, why)
    assert response.status_code == 200
    data = response.json()
    assert data["status"] == "compensated"
    assert data["compensation"]["external_reference"] == "app@v2"
    assert data["compensation"]["ended_at"].endswith("Z")
    refused = post(client_for(operator), url, why, key="k-2")
    assert refused.status_code == 409 and refused.json()["code"] == "invalid_state"


def test_an_irreversible_effect_is_refused_compensation(operator: User, mailbox: list[Any]) -> None:
    start(approvals=["announce"])
    done = perform(
        claim(),
        step="announce",
        tool="email",
        target="ops@example.com",
        request={"to": "ops@example.com", "subject": "s"},
    )
    response = post(
        client_for(operator),
        f"/api/side-effects/{done.side_effect.operation_id}/compensate",
        {"reason": "wrong list"},
    )
    assert response.status_code == 409
    assert response.json()["detail"] == "email on ops@example.com cannot be undone."


def test_compensating_needs_a_reason(config_dir: Path, operator: User) -> None:
    _, effect = confirmed_config()
    url = f"/api/side-effects/{effect.operation_id}/compensate"
    response = post(client_for(operator), url, {"reason": "  "})
    assert response.status_code == 422 and response.json()["code"] == "invalid_input"
    assert response.json()["errors"][0]["pointer"] == "/reason"
    effect.refresh_from_db()
    assert effect.status == "confirmed" and effect.compensation_idempotency_key == ""


def test_compensating_refuses_target_changed_unless_forced(
    config_dir: Path, operator: User
) -> None:
    from ledger.tools.config_store import ConfigStoreTool

    _, effect = confirmed_config()
    ConfigStoreTool().store().write(
        CONFIG["document"], {"someone": "else"}, idempotency_key="other"
    )
    url = f"/api/side-effects/{effect.operation_id}/compensate"
    refused = post(client_for(operator), url, {"reason": "undo the rotation"})
    assert refused.status_code == 409
    problem = refused.json()
    assert problem["code"] == "target_changed"
    assert problem["current_version"] == problem["written_version"] + 1
    effect.refresh_from_db()
    assert effect.status == "confirmed" and effect.compensation_idempotency_key == ""
    forced = post(
        client_for(operator), url, {"reason": "undo the rotation", "force": True}, key="k-2"
    )
    assert forced.status_code == 200 and forced.json()["status"] == "compensated"
    effect.refresh_from_db()
    assert effect.compensation_reason == "undo the rotation"


# --- Worker routes ----------------------------------------------------------------------------


def begin_url(lease: Any) -> str:
    return f"/api/worker/attempts/{lease.attempt_id}/side-effects"


def outcome_url(operation_id: str) -> str:
    return f"/api/worker/side-effects/{operation_id}/outcome"


def http_claim(wclient: APIClient, worker: str = "w1") -> Any:
    """Claim over the worker API: the attempt is bound to ``wclient``'s token."""
    response = api_post(wclient, "/api/worker/claim", {"worker_id": worker})
    assert response.status_code == 200, response.content[:300]
    return SimpleNamespace(**response.json())


def http_crash(lease: Any, wclient: APIClient) -> Any:
    """The worker holding ``lease`` dies; the worker behind ``wclient`` claims the next attempt."""
    lose_lease(lease)
    return http_claim(wclient, "w2")


def begin_body(lease: Any, receiver: Receiver, **extra: Any) -> dict[str, Any]:
    return {
        "lease_epoch": lease.lease_epoch,
        "cancel_epoch": lease.cancel_epoch,
        "step_id": "deploy",
        "tool": "webhook",
        "target": "deploy-hook",
        "request": hook(receiver),
        **extra,
    }


def test_a_worker_begins_acts_and_records_over_http(receiver: Receiver, wclient: APIClient) -> None:
    start(approvals=["deploy"])
    lease = http_claim(wclient)
    answer = post(wclient, begin_url(lease), begin_body(lease, receiver), key=None)
    assert answer.status_code == 200
    data = answer.json()
    assert data["decision"] == "act" and data["reversibility"] == "irreversible"
    done = get_tool("webhook").execute(hook(receiver), data["idempotency_key"])
    body = {
        "status": "confirmed",
        "external_reference": done.external_reference,
        "result": done.result,
        "lease_epoch": lease.lease_epoch,
        "cancel_epoch": lease.cancel_epoch,
    }
    outcome = post(wclient, outcome_url(data["operation_id"]), body, key="out-1")
    assert outcome.status_code == 200
    assert (outcome.json()["status"], outcome.json()["late"]) == ("confirmed", False)
    # The worker lost that answer and sends it again with the same key: the same answer.
    resent = post(wclient, outcome_url(data["operation_id"]), body, key="out-1")
    assert resent["Idempotent-Replayed"] == "true" and resent.json() == outcome.json()
    again = post(wclient, begin_url(lease), begin_body(lease, receiver), key=None).json()
    assert again["decision"] == "reuse" and again["external_reference"] == "dlv_1"
    assert again["result"]["status_code"] == 201


def test_the_worker_routes_answer_the_ledgers_refusals(
    receiver: Receiver, wclient: APIClient
) -> None:
    start()
    lease = http_claim(wclient)
    held = post(wclient, begin_url(lease), begin_body(lease, receiver), key=None)
    assert held.status_code == 409 and held.json()["code"] == "approval_required"
    assert held.json()["step_id"] == "deploy"
    bad = post(wclient, begin_url(lease), begin_body(lease, receiver, tool="nope"), key=None)
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_input"
    wrong = post(
        wclient, begin_url(lease), begin_body(lease, receiver, request={"url": "ftp://x"}), key=None
    )
    assert wrong.status_code == 422 and wrong.json()["errors"][0]["pointer"] == "/request"
    new = http_crash(lease, wclient)
    stale = post(wclient, begin_url(lease), begin_body(lease, receiver), key=None)
    assert stale.status_code == 409 and stale.json()["code"] == "stale_worker"
    compensable = begin_body(
        new,
        receiver,
        reversibility="compensable",
        compensating_action={"url": receiver.url("/undo")},
    )
    op = post(wclient, begin_url(new), compensable, key=None).json()["operation_id"]
    post(wclient, outcome_url(op), {"status": "unknown"}, key=None)
    unknown = post(wclient, begin_url(new), compensable, key=None)
    assert unknown.status_code == 409 and unknown.json()["code"] == "side_effect_unknown"
    assert unknown.json()["operation_id"] == op


def test_a_stale_workers_outcome_over_http_is_recorded_late(
    receiver: Receiver, wclient: APIClient
) -> None:
    start(approvals=["deploy"])
    old = http_claim(wclient)
    op = post(wclient, begin_url(old), begin_body(old, receiver), key=None).json()
    http_crash(old, wclient)
    response = post(
        wclient,
        outcome_url(op["operation_id"]),
        {"status": "failed", "error": {"message": "refused"}, "lease_epoch": old.lease_epoch},
        key=None,
    )
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["late"]) == ("failed", True)


def test_worker_routes_are_closed_to_people(
    receiver: Receiver, operator: User, wclient: APIClient
) -> None:
    start(approvals=["deploy"])
    lease = claim()
    body = begin_body(lease, receiver)
    assert post(APIClient(), begin_url(lease), body, key=None).status_code == 401
    assert post(client_for(operator), begin_url(lease), body, key=None).status_code == 401
    assert wclient.get(begin_url(lease)).status_code == 405
    missing = post(wclient, outcome_url("op_nope"), {"status": "confirmed"}, key=None)
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    assert not SideEffect.objects.exists()
    # And a worker token opens no control endpoint.
    assert wclient.get("/api/side-effects").status_code in (401, 403)
