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
from runs.events import Changes, append_event
from runs.models import Run, RunEvent
from tests.live.conftest import db, run
from tests.runs.factory import interrupted, start

# These tests run inside one test transaction: each "commit" is a captured on-commit block,
# and the set-up is committed (its push sent) before the block under test.


def batches(callbacks: list[Any]) -> list[Changes]:
    """The run store's after-commit publishing, one per committed transaction."""
    return [c for c in callbacks if isinstance(c, Changes)]


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
    message = broadcast.message_for(["run_1", "run_2"], ["run_2"], ["7"], ["deploy"])
    assert set(message) == {
        "type",
        "run_ids",
        "request_run_ids",
        "worker_ids",
        "agents",
        "push_id",
    }
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
    # A run waiting for a person: no worker pool a test left running in this process can
    # claim it while the test listens (a queued run could be, and its claim is a commit).
    target, _lease, _cp, _req = interrupted()
    # The set-up's own pushes are on their way on the sender's thread: delivered before this
    # test listens, or one may arrive after the subscription and read as a second message.
    assert broadcast.drain(60)
    seq = Run.objects.get(pk=target.id).last_event_seq

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

    messages = run(scenario)
    events = list(
        RunEvent.objects.filter(run_id=target.id, seq__gt=seq).values_list("type", "actor")
    )
    assert len(messages) == 1, (messages, events)
    [message] = messages
    assert message["type"] == broadcast.MESSAGE_TYPE
    assert message["run_ids"] == [target.id]
    assert message["request_run_ids"] == [target.id]  # the cancel closed its question
    assert json.loads(json.dumps(message)) == message


@pytest.mark.redis
def test_a_burst_of_pushes_is_all_sent_through_redis_none_lost_to_the_pool() -> None:
    # A web process at 1,000 live agents commits hundreds of writes a second, each one push.
    # redis-py gives the sender's event loop a pool of 100 connections and refuses the 101st
    # (MaxConnectionsError): the sender keeps fewer sends than that on their way.
    from channels_redis.core import RedisChannelLayer

    assert isinstance(get_channel_layer(), RedisChannelLayer)
    futures = [broadcast.push([f"run_burst_{i}"]) for i in range(400)]
    assert broadcast.drain(120)
    failed = [f.exception() for f in futures if f is not None and f.exception() is not None]
    assert None not in futures
    assert failed == []
