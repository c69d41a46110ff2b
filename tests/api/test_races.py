"""Races over HTTP on real PostgreSQL: threads behind a barrier, each with its own connection."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections
from rest_framework.test import APIClient

from runs import services
from runs.models import Attempt, IdempotencyRecord, Run, RunEvent
from tests.api.conftest import client_for, post, worker_client
from tests.runs.factory import start

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
]


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` in threads released together; return their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = call()
        except BaseException as exc:
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def assert_one_winner_and_replays(responses: list[Any], winner_status: int) -> Any:
    winners = [
        r for r in responses if r.status_code == winner_status and "Idempotent-Replayed" not in r
    ]
    assert len(winners) == 1, [(r.status_code, r.content[:80]) for r in responses]
    winner = winners[0]
    for response in responses:
        if response is winner:
            continue
        if response.status_code == 409:
            assert response.json()["code"] == "idempotency_in_progress"
            assert int(response["Retry-After"]) >= 1
        else:
            assert response.status_code == winner_status
            assert response["Idempotent-Replayed"] == "true"
            assert response.content == winner.content
    return winner


def test_it_starts_one_run_for_ten_identical_requests(operator) -> None:
    clients = [client_for(operator) for _ in range(10)]
    body = {"agent": "test-agent", "input": {"n": 7}}
    responses = race(*[lambda c=c: post(c, "/api/runs", body, key="same-start") for c in clients])
    winner = assert_one_winner_and_replays(responses, 201)
    assert list(Run.objects.values_list("id", flat=True)) == [winner.json()["run_id"]]
    assert IdempotencyRecord.objects.get(key="same-start").state == "completed"


def test_it_cancels_once_for_ten_identical_requests(operator) -> None:
    run = start()
    services.attempt_claim(worker_id="w1")
    clients = [client_for(operator) for _ in range(10)]
    url = f"/api/runs/{run.pk}/cancel"
    responses = race(
        *[lambda c=c: post(c, url, {"reason": "stop"}, key="same-cancel") for c in clients]
    )
    winner = assert_one_winner_and_replays(responses, 202)
    assert winner.json()["status"] == "cancel_requested"
    assert RunEvent.objects.filter(run=run, type="run.cancel_requested").count() == 1
    assert Run.objects.get(pk=run.pk).cancel_epoch == 1


def test_it_gives_one_attempt_to_one_of_two_claiming_workers(operator) -> None:
    run = start()
    workers = [worker_client("wa"), worker_client("wb")]
    responses = race(
        *[
            lambda w=w, i=i: post(w, "/api/worker/claim", {"worker_id": f"w{i}"})
            for i, w in enumerate(workers)
        ]
    )
    assert sorted(r.status_code for r in responses) == [200, 204]
    lease = next(r for r in responses if r.status_code == 200).json()
    assert lease["run_id"] == run.pk
    assert Run.objects.get(pk=run.pk).lease_epoch == 1


@pytest.mark.parametrize("round_", range(3))
def test_it_lets_either_cancel_or_complete_win_but_never_both(operator, round_: int) -> None:
    run = start()
    worker = worker_client(f"w-race-{round_}")
    lease = post(worker, "/api/worker/claim", {"worker_id": "w1"}).json()
    person = client_for(operator)
    cancel, complete = race(
        lambda: post(person, f"/api/runs/{run.pk}/cancel", {"reason": "stop"}, key="c"),
        lambda: post(
            worker,
            f"/api/worker/attempts/{lease['attempt_id']}/complete",
            {
                "lease_epoch": lease["lease_epoch"],
                "cancel_epoch": lease["cancel_epoch"],
                "result": {},
            },
        ),
    )
    final = Run.objects.get(pk=run.pk)
    attempt = Attempt.objects.get(pk=lease["attempt_id"])
    if cancel.status_code == 202:
        # The cancel committed first: the late result is fenced off and changes nothing.
        assert complete.status_code == 409
        assert complete.json()["code"] == "stale_after_cancel"
        assert final.status == "cancel_requested" and final.result is None
        assert attempt.status == "running"
    else:
        # The result committed first: there is nothing left to cancel.
        assert complete.status_code == 200
        assert cancel.status_code == 409 and cancel.json()["code"] == "invalid_state"
        assert final.status == "succeeded" and final.cancel_epoch == 0


def test_it_lets_only_the_current_lease_holder_write_when_old_and_new_race(operator) -> None:
    import datetime as dt

    from django.utils import timezone

    from runs.models import Checkpoint

    run = start()
    old_worker, new_worker = worker_client("w-old"), worker_client("w-new")
    old = post(old_worker, "/api/worker/claim", {"worker_id": "old"}).json()
    # The old worker stalls past its lease (moved in the DB: PostgreSQL's clock decides).
    Attempt.objects.filter(pk=old["attempt_id"]).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    services.leases_expire()
    new = post(new_worker, "/api/worker/claim", {"worker_id": "new"}).json()

    def checkpoint(client: Any, lease: dict[str, Any], step: str) -> Any:
        body = {
            "lease_epoch": lease["lease_epoch"],
            "cancel_epoch": lease["cancel_epoch"],
            "step": step,
            "state": {},
        }
        return post(client, f"/api/worker/attempts/{lease['attempt_id']}/checkpoint", body)

    stale, current = race(
        lambda: checkpoint(old_worker, old, "from-old"),
        lambda: checkpoint(new_worker, new, "from-new"),
    )
    assert stale.status_code == 409 and stale.json()["code"] == "stale_worker"
    assert current.status_code == 201
    assert list(Checkpoint.objects.filter(run=run).values_list("step", flat=True)) == ["from-new"]


def test_it_saves_one_checkpoint_for_ten_identical_worker_requests(operator) -> None:
    # A worker's checkpoint writes its Idempotency-Key record in its own transaction
    # (api/worker.py, idempotency_in_transaction): the losers roll their work back.
    start()
    claimer = worker_client("w-same-key")
    lease = post(claimer, "/api/worker/claim", {"worker_id": "w1"}).json()
    token = claimer._credentials["HTTP_AUTHORIZATION"]
    clients = []
    for _ in range(10):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=token)  # the claiming worker's own token
        clients.append(client)
    url = f"/api/worker/attempts/{lease['attempt_id']}/checkpoint"
    body = {
        "lease_epoch": lease["lease_epoch"],
        "cancel_epoch": lease["cancel_epoch"],
        "step": "next",
        "state": {"n": 1},
    }
    responses = race(*[lambda c=c: post(c, url, body, key="same-checkpoint") for c in clients])
    winner = assert_one_winner_and_replays(responses, 201)
    assert winner.json()["step"] == "next"
    run = Run.objects.get()
    assert run.checkpoints.count() == 1
    assert RunEvent.objects.filter(run=run, type="checkpoint.saved").count() == 1
    assert IdempotencyRecord.objects.get(key="same-checkpoint").state == "completed"
