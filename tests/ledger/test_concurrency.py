"""Races on real PostgreSQL: threads behind a barrier, exactly one winner."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from ledger import services as ledger
from ledger.models import SideEffect
from runs.errors import HoldpointError
from tests.runs.factory import claim, epochs, start

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def race(n: int, func: Callable[[], Any]) -> list[Any]:
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        try:
            barrier.wait()
            results[i] = func()
        except Exception as exc:
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_racing_begins_for_one_step_give_exactly_one_act(config_dir: Path) -> None:
    start()
    lease = claim()
    results = race(
        6,
        lambda: (
            ledger.side_effect_begin(
                **epochs(lease),
                step_id="rotate",
                tool="config_store",
                target="app",
                request={"document": "app", "content": {}},
            ).decision
        ),
    )
    assert sorted(results) == ["act"] + ["look_up"] * 5
    assert SideEffect.objects.count() == 1


def test_racing_reconciliations_settle_once(config_dir: Path) -> None:
    start()
    lease = claim()
    op = ledger.side_effect_begin(
        **epochs(lease),
        step_id="rotate",
        tool="config_store",
        target="app",
        request={"document": "app", "content": {}},
    ).operation_id
    ledger.side_effect_record_outcome(operation_id=op, status="unknown")
    results = race(
        4,
        lambda: ledger.side_effect_reconcile(operation_id=op, outcome="confirmed", note="seen"),
    )
    winners = [r for r in results if isinstance(r, SideEffect)]
    losers = [r for r in results if isinstance(r, HoldpointError)]
    assert len(winners) == 1 and len(losers) == 3
    assert {e.code for e in losers} == {"invalid_state"}
