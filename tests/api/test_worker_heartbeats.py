"""``POST /api/worker/heartbeat``: one renewal for all the attempts a worker process holds.

Each attempt is fenced on its own and answered in its place; a refused entry changes
nothing; a list too long, or naming an attempt twice, is refused whole as problem+json.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from runs import services
from runs.models import Attempt
from runs.tokens import worker_token_revoke
from tests.api.conftest import post, worker_client
from tests.runs.factory import snapshot, start

pytestmark = pytest.mark.django_db

URL = "/api/worker/heartbeat"
PROBLEM = "application/problem+json"


def claim(worker: Any, worker_id: str) -> dict[str, Any]:
    response = post(worker, "/api/worker/claim", {"worker_id": worker_id, "lease_seconds": 30})
    assert response.status_code == 200, response.content
    return response.json()


def entry(lease: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"attempt_id": lease["attempt_id"], "lease_epoch": lease["lease_epoch"], **extra}


def expiry(lease: dict[str, Any]) -> Any:
    return Attempt.objects.get(pk=lease["attempt_id"]).lease_expires_at


def test_it_renews_every_attempt_of_the_batch_and_answers_each_in_order(wclient) -> None:
    start(), start()
    a, b = claim(wclient, "w/1"), claim(wclient, "w/2")
    before = expiry(a), expiry(b)
    response = post(wclient, URL, {"attempts": [entry(b), entry(a)], "lease_seconds": 120})
    assert response.status_code == 200, response.content
    answers = response.json()["attempts"]
    assert [x["attempt_id"] for x in answers] == [b["attempt_id"], a["attempt_id"]]
    assert all(x["ok"] and not x["cancel_requested"] for x in answers)
    assert all(100 < x["lease_seconds_left"] <= 120 for x in answers)
    assert expiry(a) > before[0] and expiry(b) > before[1]


def test_a_stale_epoch_gets_its_own_refusal_and_changes_nothing(wclient) -> None:
    start(), start()
    a, b = claim(wclient, "w/1"), claim(wclient, "w/2")
    before_b = snapshot(b["run_id"])
    old = expiry(a)
    stale = {**entry(b), "lease_epoch": b["lease_epoch"] + 1}
    response = post(wclient, URL, {"attempts": [entry(a, cost=0.5), stale]})
    assert response.status_code == 200, response.content
    good, refused = response.json()["attempts"]
    assert good["ok"] is True
    assert refused["ok"] is False
    assert refused["problem"]["code"] == "stale_worker"
    assert refused["problem"]["status"] == 409
    assert snapshot(b["run_id"]) == before_b
    assert expiry(a) > old
    assert str(Attempt.objects.get(pk=a["attempt_id"]).cost) == "0.500000"


def test_an_attempt_of_another_token_is_refused_for_that_entry(wclient) -> None:
    start(), start()
    mine = claim(wclient, "w/1")
    other = worker_client("someone-else")
    theirs = claim(other, "x/1")
    before = snapshot(theirs["run_id"])
    response = post(wclient, URL, {"attempts": [entry(theirs), entry(mine)]})
    assert response.status_code == 200
    refused, good = response.json()["attempts"]
    assert refused["problem"]["code"] == "not_your_lease"
    assert good["ok"] is True
    assert snapshot(theirs["run_id"]) == before


def test_an_unknown_attempt_is_not_found_for_that_entry(wclient) -> None:
    response = post(
        wclient,
        URL,
        {"attempts": [{"attempt_id": "att_00000000000000000000000000", "lease_epoch": 1}]},
    )
    assert response.status_code == 200
    assert response.json()["attempts"][0]["problem"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"attempts": []}, "/attempts"),
        ({}, "/attempts"),
        ({"attempts": [{"attempt_id": "att_x"}]}, "/attempts/0/lease_epoch"),
        ({"attempts": [{"attempt_id": "att_x", "lease_epoch": -1}]}, "/attempts/0/lease_epoch"),
        ({"attempts": [{"attempt_id": "att_x", "lease_epoch": 1}], "wait": 61}, "/wait"),
    ],
)
def test_it_refuses_a_malformed_batch_with_a_problem(wclient, body: Any, pointer: str) -> None:
    response = post(wclient, URL, body)
    assert response.status_code == 422, response.content
    assert response["Content-Type"].startswith(PROBLEM)
    assert response.json()["code"] == "invalid_input"
    assert pointer in [e["pointer"] for e in response.json()["errors"]]


def test_it_refuses_a_list_too_long_or_repeated_and_renews_none(wclient) -> None:
    start()
    lease = claim(wclient, "w/1")
    old = expiry(lease)
    too_long = [entry(lease)] + [
        {"attempt_id": f"att_{i:026d}", "lease_epoch": 1}
        for i in range(services.MAX_HEARTBEAT_BATCH)
    ]
    for attempts in (too_long, [entry(lease), entry(lease)]):
        response = post(wclient, URL, {"attempts": attempts})
        assert response.status_code == 422, response.content
        assert response["Content-Type"].startswith(PROBLEM)
        assert response.json()["code"] == "invalid_input"
        assert response.json()["errors"][0]["pointer"] == "/attempts"
    assert expiry(lease) == old


def test_it_takes_worker_tokens_only_and_honours_a_revocation_at_once(operator) -> None:
    from tests.api.conftest import client_for

    person = client_for(operator)
    response = post(person, URL, {"attempts": [{"attempt_id": "att_x", "lease_epoch": 1}]})
    assert response.status_code in (401, 403)
    assert response["Content-Type"].startswith(PROBLEM)
    worker = worker_client("soon-gone")
    body = {"attempts": [{"attempt_id": "att_x", "lease_epoch": 1}]}
    assert post(worker, URL, body).status_code == 200  # the token is now cached
    worker_token_revoke(name="soon-gone")
    response = post(worker, URL, body)
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"


def test_a_wait_is_not_cut_short_by_a_cancel_the_worker_already_heard(wclient) -> None:
    first, _ = start(), start()
    a, b = claim(wclient, "w/1"), claim(wclient, "w/2")
    cancelled = a if a["run_id"] == first.id else b
    services.run_cancel(run_id=first.id, actor="test")
    began = time.monotonic()
    response = post(wclient, URL, {"attempts": [entry(a), entry(b)], "wait": 0.3})
    held = time.monotonic() - began
    assert response.status_code == 200
    answers = {x["attempt_id"]: x for x in response.json()["attempts"]}
    assert answers[cancelled["attempt_id"]]["cancel_requested"] is True
    assert sum(x["cancel_requested"] for x in answers.values()) == 1
    # Held for the quiet attempt: the known cancel did not answer the call at once.
    assert held >= 0.3


def test_a_token_revoked_by_another_process_is_refused_within_the_cache_bound(settings) -> None:
    settings.HOLDPOINT_WORKER_TOKEN_CACHE_SECONDS = 0.3
    from django.utils import timezone

    from runs.models import WorkerToken

    worker = worker_client("revoked-elsewhere")
    body = {"attempts": [{"attempt_id": "att_x", "lease_epoch": 1}]}
    assert post(worker, URL, body).status_code == 200  # looked up, now trusted for 0.3 s
    # As the command line or another web process revokes it: this process is not told.
    WorkerToken.objects.filter(name="revoked-elsewhere").update(revoked_at=timezone.now())
    time.sleep(0.4)
    response = post(worker, URL, body)
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"
