"""The one push helper: one message per committed transaction, ids only, nothing on rollback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from channels.layers import get_channel_layer
from django.db import transaction

from live import broadcast
from runs import services
from runs.events import append_event
from runs.models import Run
from tests.live.conftest import db, run
from tests.runs.factory import interrupted, start

# These tests run inside one test transaction: each "commit" is a captured on-commit block,
# and the set-up is committed (its push sent) before the block under test.


def batches(callbacks: list[Any]) -> list[broadcast.Batch]:
    return [c for c in callbacks if isinstance(c, broadcast.Batch)]


def log_line(run: Run, text: str) -> None:
    """Append an event the way every service does: run row locked, same transaction."""
    locked = Run.objects.select_for_update().get(pk=run.id)
    append_event(locked, "agent.log", "worker:w1", {"message": text})
    locked.save(update_fields=["last_event_seq"])


@pytest.mark.django_db
def test_it_schedules_one_push_for_a_service_call_of_many_events(
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        target, _lease, _cp, _req = interrupted()
    before = Run.objects.get(pk=target.id).last_event_seq
    with django_capture_on_commit_callbacks() as callbacks:
        services.run_cancel(run_id=target.id, reason="not needed")
    assert Run.objects.get(pk=target.id).last_event_seq - before >= 2
    [batch] = batches(callbacks)
    assert batch.run_ids == {target.id}


@pytest.mark.django_db
def test_it_schedules_one_push_for_every_run_a_transaction_changed(
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        first, second = start(), start()
    with django_capture_on_commit_callbacks() as callbacks, transaction.atomic():
        log_line(first, "one")
        log_line(second, "two")
        log_line(first, "three")
    [batch] = batches(callbacks)
    assert batch.run_ids == {first.id, second.id}


@pytest.mark.django_db
def test_it_schedules_a_new_push_for_each_commit(django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        target = start()
    with django_capture_on_commit_callbacks(execute=True) as first:
        log_line(target, "one")
    with django_capture_on_commit_callbacks(execute=True) as second:
        log_line(target, "two")
    assert len(batches(first)) == 1
    assert len(batches(second)) == 1
    assert batches(first)[0] is not batches(second)[0]
    assert all(b.sent for b in batches(first) + batches(second))


@pytest.mark.django_db
def test_it_schedules_nothing_for_a_rolled_back_savepoint(
    django_capture_on_commit_callbacks: Any,
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        kept, rolled_back = start(), start()
    with (  # noqa: PT012 - the rollback is the point
        django_capture_on_commit_callbacks() as callbacks,
        pytest.raises(RuntimeError),
        transaction.atomic(),
    ):
        log_line(rolled_back, "never happened")
        raise RuntimeError
    assert batches(callbacks) == []

    with django_capture_on_commit_callbacks() as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():  # noqa: PT012 - the rollback is the point
            log_line(rolled_back, "never happened")
            raise RuntimeError
        log_line(kept, "happened")  # after the rollback: a new batch, with only this run
    [batch] = batches(callbacks)
    assert batch.run_ids == {kept.id}


def test_a_message_is_ids_only_and_survives_json() -> None:
    message = broadcast.message_for(["run_1", "run_2"], ["run_2"])
    assert set(message) == {"type", "run_ids", "request_run_ids", "push_id"}
    assert json.loads(json.dumps(message)) == message


@pytest.mark.django_db
def test_it_says_which_runs_questions_changed(django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        quiet = start()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        log_line(quiet, "a log line is not about a question")
    [batch] = batches(callbacks)
    assert batch.request_run_ids == set()

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        _run, _lease, _cp, req = interrupted()  # asks on the oldest queued run
    asking = req.run_id
    assert any(asking in b.request_run_ids for b in batches(callbacks))

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        services.run_cancel(run_id=asking, reason="no")  # closes the question
    [batch] = batches(callbacks)
    assert batch.request_run_ids == {asking}


@pytest.mark.django_db(transaction=True)
def test_it_delivers_one_message_per_commit_through_the_channel_layer() -> None:
    target = start()

    async def scenario() -> list[dict[str, Any]]:
        layer: Any = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(broadcast.GROUP, channel)
        broadcast.attach_loop(asyncio.get_running_loop())  # as a consumer does
        await db(lambda: services.run_cancel(run_id=target.id, reason="stop"))()
        received = [await asyncio.wait_for(layer.receive(channel), 5)]
        with contextlib.suppress(TimeoutError):
            while True:
                received.append(await asyncio.wait_for(layer.receive(channel), 0.5))
        await layer.group_discard(broadcast.GROUP, channel)
        # Only this test's: a Redis shared with another Holdpoint (make run, a chaos run)
        # carries their pushes in the same group.
        return [m for m in received if target.id in m["run_ids"]]

    [message] = run(scenario)
    assert message["type"] == broadcast.MESSAGE_TYPE
    assert message["run_ids"] == [target.id]
    assert message["request_run_ids"] == []
    assert json.loads(json.dumps(message)) == message
