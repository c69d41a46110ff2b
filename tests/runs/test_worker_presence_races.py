"""Issue 25, point 1, on real PostgreSQL: a worker's presence is one row however many
processes see it first at once, and the sweep's moves never undo a contact.

Four web processes hearing from the same new worker at once (each its first call there)
all write it: ``INSERT … ON CONFLICT DO NOTHING`` lets each through, the row lock orders
them, and none fails on the unique (principal, name). A sweep that finds the worker
silent and a contact that arrives at the same moment: the sweep's compare-and-set on the
state it read loses to the contact, which leaves the worker alive."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db.models import F

from runs import services
from runs.models import Worker
from runs.services.workers import forget_contacts
from runs.workers import Identity, principal_for_token
from tests.runs.test_races import race

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def identity(pid: int, name: str = "fleet-1") -> Identity:
    return Identity(
        name=name,
        principal=principal_for_token("fleet"),
        client="holdpoint-client-python",
        client_version="0.1.0",
        host="build-7",
        pid=pid,
        agents=("deploy",),
        lease_seconds=30,
    )


def test_first_contacts_at_once_make_one_worker() -> None:
    for round_ in range(10):
        name = f"fleet-{round_}"
        results = race(
            *(
                lambda pid=pid: services.worker_seen(identity=identity(pid, name))
                for pid in range(4)
            )
        )
        assert results == [True, True, True, True], results
        [row] = Worker.objects.filter(name=name)
        assert row.pid in range(4) and row.state == "alive"


def test_a_sweep_racing_a_contact_leaves_the_worker_alive() -> None:
    services.worker_seen(identity=identity(1))
    for pid in range(2, 22):
        forget_contacts()
        # Silent for 45 s, past its 40 s window: the sweep would mark it stale.
        back = dt.timedelta(seconds=45)
        Worker.objects.update(
            state="alive",
            last_seen_at=F("last_seen_at") - back,
            stale_at=F("stale_at") - back,
            gone_at=F("gone_at") - back,
        )
        results = race(
            services.workers_sweep,
            lambda pid=pid: services.worker_seen(identity=identity(pid)),
        )
        assert not any(isinstance(r, Exception) for r in results), results
        row = Worker.objects.get()
        # Whoever went first, the contact is the last word: alive, at its pid (a sweep
        # that read the silent worker before the contact committed must not mark it
        # stale after).
        assert (row.state, row.pid) == ("alive", pid)
