"""Idempotency-Key: every row of the table in docs/api.md (Idempotency-Key), over HTTP and in the core."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.test import override_settings
from django.utils import timezone

from runs import services
from runs.errors import HoldpointError
from runs.idempotency import (
    StoredResponse,
    idempotency_records_purge,
    idempotent_call,
    parse_idempotency_key,
    principal_for_user,
    request_fingerprint,
)
from runs.models import IdempotencyRecord, Run, RunEvent
from runs.services.control import _retry_guards, register_retry_guard
from tests.api.conftest import client_for, post
from tests.runs.factory import claim, epochs, interrupted, snapshot, start

pytestmark = pytest.mark.django_db


def cancel_url(run: Run) -> str:
    return f"/api/runs/{run.pk}/cancel"


def events(run: Run, type: str) -> int:
    return RunEvent.objects.filter(run=run, type=type).count()


# --- The header ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "key"),
    [
        (["abc"], "abc"),
        (['"abc"'], "abc"),  # the structured-field string is the same key
        ([" abc "], "abc"),
        (['"a\\"b\\\\c"'], 'a"b\\c'),
        (['"a,b"'], "a,b"),  # a comma inside quotes is part of the key
        (["x" * 255], "x" * 255),
        (["with space"], "with space"),
    ],
)
def test_it_parses_bare_and_quoted_keys(values: list[str], key: str) -> None:
    assert parse_idempotency_key(values) == key


@pytest.mark.parametrize(
    "values",
    [
        [""],
        ['""'],
        ["x" * 256],
        ["ключ"],
        ["tab\there"],
        ["a, b"],  # two header lines, as the server joins them
        ["a", "b"],  # two header lines, given separately
        ['"a", "b"'],
        ['"abc'],
        ['"abc"x'],
        ['"a\\bc"'],
        ["a,"],
    ],
)
def test_it_refuses_malformed_keys(values: list[str]) -> None:
    with pytest.raises(HoldpointError) as exc:
        parse_idempotency_key(values)
    assert exc.value.code == "idempotency_key_malformed"
    assert exc.value.status == 400


def test_it_requires_a_key() -> None:
    with pytest.raises(HoldpointError) as exc:
        parse_idempotency_key([])
    assert exc.value.code == "idempotency_key_missing"


# --- Row 1 and 2: missing or malformed -----------------------------------------------------------


@pytest.mark.parametrize("operation", ["resume", "cancel", "retry"])
def test_it_answers_400_without_a_key_on_the_control_operations(operator, operation) -> None:
    run = start()
    before = snapshot(run.pk)
    response = post(client_for(operator), f"/api/runs/{run.pk}/{operation}", {"reason": "x"})
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "idempotency_key_missing"
    assert snapshot(run.pk) == before
    assert not IdempotencyRecord.objects.exists()


def test_it_answers_400_for_a_malformed_key_and_changes_nothing(operator) -> None:
    run = start()
    before = snapshot(run.pk)
    for key in ["", "x" * 256, "a, b", '"open']:
        response = post(client_for(operator), cancel_url(run), key=key)
        assert response.status_code == 400, key
        assert response.json()["code"] == "idempotency_key_malformed"
    assert snapshot(run.pk) == before


def test_it_starts_a_run_without_a_key(operator) -> None:
    response = post(client_for(operator), "/api/runs", {"agent": "test-agent", "input": {"n": 1}})
    assert response.status_code == 201
    assert not IdempotencyRecord.objects.exists()


# --- Row 3: same key, same request, finished -----------------------------------------------------


def test_it_replays_the_stored_answer(operator) -> None:
    run = start()
    client = client_for(operator)
    first = post(client, cancel_url(run), {"reason": "stop"}, key="k-1")
    assert first.status_code == 202
    assert "Idempotent-Replayed" not in first
    again = post(client, cancel_url(run), {"reason": "stop"}, key="k-1")
    assert again.status_code == 202
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert events(run, "run.cancel_requested") == 1


def test_it_replays_a_start_instead_of_creating_a_second_run(operator) -> None:
    client = client_for(operator)
    body = {"agent": "test-agent", "input": {"n": 1}}
    first = post(client, "/api/runs", body, key="start-1")
    again = post(client, "/api/runs", body, key="start-1")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["run_id"] == first.json()["run_id"]
    assert Run.objects.count() == 1


def test_it_treats_key_order_whitespace_and_quoting_as_the_same_request(operator) -> None:
    run = start()
    client = client_for(operator)
    url = f"/api/runs/{run.pk}/cancel"
    first = client.post(
        url,
        '{"reason": "stop", "x": 1}',
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="abc",
    )
    again = client.post(
        url,
        '{ "x":1,\n  "reason":"stop" }',
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY='"abc"',
    )
    assert first.status_code == 202
    assert again["Idempotent-Replayed"] == "true"
    assert again.content == first.content


def test_it_replays_a_refusal_as_it_was(operator) -> None:
    run = start()
    lease = claim()
    services.attempt_complete(**epochs(lease), result={})
    client = client_for(operator)
    first = post(client, cancel_url(run), key="late")
    assert first.status_code == 409
    assert first.json()["code"] == "invalid_state"
    again = post(client, cancel_url(run), key="late")
    assert again.status_code == 409
    assert again["Idempotent-Replayed"] == "true"
    assert again["Content-Type"] == "application/problem+json"
    assert again.content == first.content


def test_it_replays_a_resume_rather_than_saying_already_answered(operator) -> None:
    run, _lease, cp, request = interrupted()
    body = {"request_id": request.id, "checkpoint_id": cp.id, "value": {"versions": ["v2"]}}
    client = client_for(operator)
    first = post(client, f"/api/runs/{run.pk}/resume", body, key="answer-1")
    again = post(client, f"/api/runs/{run.pk}/resume", body, key="answer-1")
    fresh = post(client, f"/api/runs/{run.pk}/resume", body, key="answer-2")
    assert first.status_code == again.status_code == 202
    assert again["Idempotent-Replayed"] == "true"
    # A new key is a new request: the compare-and-set names who answered first.
    assert fresh.status_code == 409
    assert fresh.json()["code"] == "request_mismatch"
    assert fresh.json()["answered_by"] == "olivia"


# --- Row 4: same key, different request ----------------------------------------------------------


def test_it_answers_422_for_another_body_run_or_operation_under_the_same_key(operator) -> None:
    run, other = start(), start()
    client = client_for(operator)
    assert post(client, cancel_url(run), {"reason": "a"}, key="k").status_code == 202
    before = snapshot(other.pk)
    for url, body in [
        (cancel_url(run), {"reason": "b"}),  # another body
        (cancel_url(other), {"reason": "a"}),  # another run
        (f"/api/runs/{run.pk}/retry", {"reason": "a"}),  # another operation
    ]:
        response = post(client, url, body, key="k")
        assert response.status_code == 422, url
        problem = response.json()
        assert problem["code"] == "idempotency_key_reused"
        assert problem["first_request"] == {"method": "POST", "path": cancel_url(run)}
    assert snapshot(other.pk) == before


# --- Row 5: same key while the first is in progress ----------------------------------------------


def test_it_answers_409_with_retry_after_while_the_first_is_in_progress(operator) -> None:
    run = start()
    client = client_for(operator)
    seen = {}

    def execute() -> StoredResponse:
        # The first request is running: the same request arrives meanwhile.
        seen["response"] = post(client, cancel_url(run), {}, key="busy")
        return StoredResponse(status=202, body=b"{}", content_type="application/json")

    idempotent_call(
        principal=principal_for_user(operator),
        key="busy",
        method="POST",
        path=cancel_url(run),
        body={},
        execute=execute,
    )
    response = seen["response"]
    assert response.status_code == 409
    assert response.json()["code"] == "idempotency_in_progress"
    assert 1 <= int(response["Retry-After"]) <= 60
    assert events(run, "run.cancel_requested") == 0


def test_it_frees_the_key_when_the_work_raises() -> None:
    def execute() -> StoredResponse:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        idempotent_call(
            principal="user:1", key="k", method="POST", path="/p", body={}, execute=execute
        )
    assert not IdempotencyRecord.objects.exists()


def test_it_lets_a_retry_take_over_a_key_whose_holder_died(operator) -> None:
    run = start()
    # A request that claimed the key, then its process died before it could answer.
    IdempotencyRecord.objects.create(
        principal=principal_for_user(operator),
        key="crash",
        fingerprint=request_fingerprint(method="POST", path=cancel_url(run), body={}),
        method="POST",
        path=cancel_url(run),
        state="in_progress",
        owner="dead",
        locked_until=timezone.now() + dt.timedelta(seconds=30),
        created_at=timezone.now(),
        expires_at=timezone.now() + dt.timedelta(days=1),
    )
    client = client_for(operator)
    assert post(client, cancel_url(run), key="crash").status_code == 409
    IdempotencyRecord.objects.filter(key="crash").update(
        locked_until=timezone.now() - dt.timedelta(seconds=1)
    )
    response = post(client, cancel_url(run), key="crash")
    assert response.status_code == 202
    assert "Idempotent-Replayed" not in response
    record = IdempotencyRecord.objects.get(key="crash")
    assert (record.state, record.response_status, record.owner != "dead") == (
        "completed",
        202,
        True,
    )


# --- Scope, 5xx, expiry ----------------------------------------------------------------------


def test_it_scopes_keys_to_the_principal(operator, viewer, outsider, admin_user) -> None:
    run = start()
    first = post(client_for(operator), cancel_url(run), {}, key="shared")
    assert first.status_code == 202
    # Authentication and permission run before replay: no one else gets olivia's answer.
    assert post(client_for(outsider), cancel_url(run), {}, key="shared").status_code == 404
    assert post(client_for(viewer), cancel_url(run), {}, key="shared").status_code == 403
    other = post(client_for(admin_user), cancel_url(run), {}, key="shared")
    assert "Idempotent-Replayed" not in other
    assert other.status_code == 409  # ada's own request: the run is already cancelled
    assert other.json()["code"] == "invalid_state"
    assert IdempotencyRecord.objects.filter(key="shared").count() == 2


def test_it_does_not_store_a_5xx(operator) -> None:
    run = start()
    lease = claim()
    services.attempt_fail(**epochs(lease), error={"type": "ValueError", "message": "bad"})

    def broken_guard(run: Run) -> str | None:
        raise RuntimeError("guard crashed")

    register_retry_guard(broken_guard)
    client = client_for(operator)
    try:
        failed = post(client, f"/api/runs/{run.pk}/retry", {"reason": "go"}, key="r-1")
    finally:
        _retry_guards.remove(broken_guard)
    assert failed.status_code == 500
    assert failed.json()["code"] == "server_error"
    assert not IdempotencyRecord.objects.filter(key="r-1").exists()
    again = post(client, f"/api/runs/{run.pk}/retry", {"reason": "go"}, key="r-1")
    assert again.status_code == 202
    assert "Idempotent-Replayed" not in again


def test_it_does_not_store_a_5xx_answer_of_the_core() -> None:
    calls = []

    def execute() -> StoredResponse:
        calls.append(1)
        return StoredResponse(status=503, body=b"{}", content_type="application/json")

    for _ in range(2):
        response, replayed = idempotent_call(
            principal="user:1", key="k", method="POST", path="/p", body={}, execute=execute
        )
        assert (response.status, replayed) == (503, False)
    assert len(calls) == 2
    assert not IdempotencyRecord.objects.exists()


@override_settings(HOLDPOINT_IDEMPOTENCY_RETENTION_SECONDS=120)
def test_it_keeps_records_for_the_retention_setting(operator) -> None:
    run = start()
    post(client_for(operator), cancel_url(run), key="ttl")
    record = IdempotencyRecord.objects.get(key="ttl")
    assert record.expires_at - record.created_at == dt.timedelta(seconds=120)


def test_it_purges_expired_and_orphaned_records_in_the_sweep(operator) -> None:
    run = start()
    client = client_for(operator)
    post(client, cancel_url(run), key="old")
    post(client, cancel_url(run), key="young")
    past = timezone.now() - dt.timedelta(seconds=1)
    IdempotencyRecord.objects.filter(key="old").update(expires_at=past)
    IdempotencyRecord.objects.create(
        principal="user:x",
        key="orphan",
        fingerprint="f",
        method="POST",
        path="/p",
        state="in_progress",
        owner="dead",
        locked_until=past,
        created_at=past,
        expires_at=timezone.now() + dt.timedelta(days=1),
    )
    report = services.sweep_all()
    assert report.other["idempotency_records"] == 2
    assert set(IdempotencyRecord.objects.values_list("key", flat=True)) == {"young"}
    # No in-progress record outlives its lease after a sweep.
    assert not IdempotencyRecord.objects.filter(state="in_progress").exists()
    assert idempotency_records_purge() == 0


def test_it_treats_an_expired_record_as_absent(operator) -> None:
    run = start()
    client = client_for(operator)
    post(client, cancel_url(run), {"reason": "a"}, key="reuse")
    IdempotencyRecord.objects.filter(key="reuse").update(
        expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    response = post(client, cancel_url(run), {"reason": "b"}, key="reuse")
    assert response.status_code == 409  # run already cancelled: a fresh answer, not a 422
    assert "Idempotent-Replayed" not in response
    record = IdempotencyRecord.objects.get(key="reuse")
    assert json.loads(bytes(record.response_body))["code"] == "invalid_state"


def test_it_keeps_worker_keys_apart_from_people(operator) -> None:
    from tests.api.conftest import worker_client

    start()
    worker = worker_client("w-idem")
    first = post(worker, "/api/worker/claim", {"worker_id": "w1"}, key="claim-1")
    again = post(worker, "/api/worker/claim", {"worker_id": "w1"}, key="claim-1")
    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json()["attempt_id"] == first.json()["attempt_id"]
    assert IdempotencyRecord.objects.get(key="claim-1").principal == "worker:w-idem"


# Committed data: under ASGI each request gets its own connection (connections are context-local).
@pytest.mark.django_db(transaction=True)
def test_it_refuses_two_header_lines_as_a_server_delivers_them(operator) -> None:
    from asgiref.sync import async_to_sync
    from asgiref.testing import ApplicationCommunicator

    from config.asgi import application
    from tests.api.conftest import client_for

    run = start()
    before = snapshot(run.pk)
    token = client_for(operator)._credentials["HTTP_AUTHORIZATION"]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": cancel_url(run),
        "raw_path": cancel_url(run).encode(),
        "query_string": b"",
        "headers": [
            (b"host", b"localhost"),
            (b"authorization", token.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", b"2"),
            (b"idempotency-key", b"first"),
            (b"idempotency-key", b"second"),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("localhost", 80),
    }

    async def call() -> tuple[int, bytes]:
        app = ApplicationCommunicator(application, scope)
        await app.send_input({"type": "http.request", "body": b"{}", "more_body": False})
        start_message = await app.receive_output(10)
        body = await app.receive_output(10)
        await app.wait(10)
        return start_message["status"], body["body"]

    status, body = async_to_sync(call)()
    assert status == 400, body
    assert json.loads(body)["code"] == "idempotency_key_malformed"
    assert snapshot(run.pk) == before
