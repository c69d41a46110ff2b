"""Every action form carries a key made when it was rendered: a repeat gets the first
outcome instead of acting again (double clicks without JavaScript, proxy retries)."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from runs import services
from runs.models import Attempt, InputRequest, Run, RunEvent
from tests.dashboard.support import HTMX, answer, text
from tests.runs.factory import claim, epochs, interrupted, snapshot, start

pytestmark = pytest.mark.django_db


def events(run: Run, type: str) -> int:
    return RunEvent.objects.filter(run=run, type=type).count()


def test_it_replays_an_answer_sent_twice_with_one_key(client: Client, operator: User) -> None:
    run, _lease, _cp, req = interrupted()
    client.force_login(operator)
    first = answer(client, req, [("answer/versions", "v1")], key="k-1")
    second = answer(client, req, [("answer/versions", "v1")], key="k-1")
    assert first.status_code == second.status_code == 303
    assert first["Location"] == second["Location"]
    # The repeat says what the first did, not "already answered".
    page = client.get("/").content.decode()
    assert page.count("Answer sent. The run resumes in a new attempt.") == 2
    assert "Already answered" not in page
    assert Attempt.objects.filter(run=run).count() == 2
    assert events(run, "run.resumed") == 1


def test_it_replays_over_htmx_with_the_refreshed_card(client: Client, operator: User) -> None:
    run, _lease, _cp, req = interrupted()
    client.force_login(operator)
    first = answer(client, req, [("answer/versions", "v1")], key="k-1", htmx=True)
    second = answer(client, req, [("answer/versions", "v1")], key="k-1", htmx=True)
    assert first.status_code == second.status_code == 200
    for response in (first, second):
        assert "Answer sent." in text(response)
        assert "Answered by olivia at" in text(response)
    # Each reply brings a fresh form key for whatever comes next.
    assert events(run, "run.resumed") == 1


def test_it_refuses_one_key_for_a_different_answer(client: Client, operator: User) -> None:
    run, _lease, _cp, req = interrupted()
    client.force_login(operator)
    assert answer(client, req, [("answer/versions", "v1")], key="k-1").status_code == 303
    response = answer(client, req, [("answer/versions", "v2")], key="k-1", htmx=True)
    assert response.status_code == 422
    assert "already used for a different request" in text(response)
    assert InputRequest.objects.get(pk=req.id).answer == {"versions": ["v1"]}
    assert events(run, "run.resumed") == 1


def test_it_scopes_keys_to_the_user(client: Client, operator: User, approver: User) -> None:
    run, _lease, _cp, req = interrupted()
    client.force_login(operator)
    assert answer(client, req, [("answer/versions", "v1")], key="shared").status_code == 303
    other = Client()
    other.force_login(approver)
    response = answer(other, req, [("answer/versions", "v1")], key="shared", htmx=True)
    assert response.status_code == 409
    assert "Already answered by olivia at" in text(response)
    assert events(run, "run.resumed") == 1


def test_it_does_not_spend_a_key_on_invalid_input(client: Client, operator: User) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}}
    _run, _lease, _cp, req = interrupted(schema=schema)
    client.force_login(operator)
    assert answer(client, req, {"answer/n": "9"}, key="k-1", htmx=True).status_code == 422
    # The corrected answer may even come with the same key: the refusal used nothing.
    assert answer(client, req, {"answer/n": "2"}, key="k-1", htmx=True).status_code == 200
    assert InputRequest.objects.get(pk=req.id).answer == {"n": 2}


def test_it_cancels_once_per_key(client: Client, operator: User) -> None:
    run = start()
    claim()
    client.force_login(operator)
    data = {"idempotency_key": "c-1", "run_id": run.id, "reason": "wrong input"}
    first = client.post(f"/runs/{run.id}/cancel", data, **HTMX)
    second = client.post(f"/runs/{run.id}/cancel", data, **HTMX)
    for response in (first, second):
        assert response.status_code == 200
        assert "Cancel accepted." in text(response)
    assert Run.objects.get(pk=run.id).cancel_epoch == 1
    assert events(run, "run.cancel_requested") == 1


def test_it_retries_once_per_key(client: Client, operator: User) -> None:
    run = start()
    lease = claim()
    services.checkpoint_save(**epochs(lease), step="one", state={})
    services.attempt_fail(**epochs(lease), error={"type": "ValueError", "message": "x"})
    client.force_login(operator)
    data = {"idempotency_key": "r-1", "run_id": run.id, "reason": "fixed", "from_checkpoint": ""}
    first = client.post(f"/runs/{run.id}/retry", data)
    second = client.post(f"/runs/{run.id}/retry", data)
    assert first.status_code == second.status_code == 303
    assert Attempt.objects.filter(run=run).count() == 2
    assert events(run, "run.retried") == 1


def test_it_starts_one_run_per_key(client: Client, operator: User) -> None:
    client.force_login(operator)
    data = {"agent": "test-agent", "idempotency_key": "s-1", "answer/n": "4"}
    first = client.post("/runs/new", data)
    second = client.post("/runs/new", data)
    assert Run.objects.count() == 1
    assert first["Location"] == second["Location"] == f"/runs/{Run.objects.get().id}/"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_it_resumes_once_when_one_key_races_itself(operator: User) -> None:
    """Two POSTs with one key at the same moment (a double click without JavaScript):
    one resume, and both answers say what that one did."""
    run, _lease, _cp, req = interrupted()
    before = snapshot(run.id)["attempts"]
    barrier = threading.Barrier(2)
    results: list[tuple[int, str]] = []

    def post() -> None:
        client = Client()
        client.force_login(operator)
        barrier.wait()
        try:
            response = answer(client, req, [("answer/versions", "v1")], key="race", htmx=True)
            results.append((response.status_code, text(response)))
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [status for status, _ in results] == [200, 200]
    assert all("Answer sent." in body for _, body in results)
    assert Attempt.objects.filter(run=run).count() == len(before) + 1
    assert events(run, "run.resumed") == 1
