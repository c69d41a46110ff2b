"""Drive side effects through the real services, the way the worker runtime does."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from ledger import services as ledger
from ledger.models import SideEffect
from runs import services
from runs.models import Attempt, RunEvent
from runs.services import Lease
from tests.runs.factory import claim, epochs


def hook(receiver: Any, body: Any = None, path: str = "/hooks/deploy") -> dict[str, Any]:
    return {"url": receiver.url(path), "body": body if body is not None else {"v": 1}}


def begin(lease: Lease, *, step: str = "notify", tool: str = "webhook", **kw: Any) -> Any:
    kw.setdefault("target", "deploy-hook")
    kw.setdefault("request", {"url": "http://127.0.0.1:9/x", "body": {}})
    return ledger.side_effect_begin(**epochs(lease), step_id=step, tool=tool, **kw)


def perform(lease: Lease, *, step: str = "notify", tool: str = "webhook", **kw: Any) -> Any:
    kw.setdefault("target", "deploy-hook")
    return ledger.side_effect_perform(**epochs(lease), step_id=step, tool=tool, **kw)


def lose_lease(lease: Lease) -> None:
    """The worker holding ``lease`` dies: its lease runs out and the sweep notices. (The
    lease is moved in the database, which is the clock leases are judged by.)"""
    Attempt.objects.filter(pk=lease.attempt_id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1)
    )
    assert services.leases_expire() == 1


def crash(lease: Lease, worker: str = "w2") -> Lease:
    """The worker holding ``lease`` dies and another worker claims the new attempt."""
    lose_lease(lease)
    return claim(worker)


def fail_unknown(lease: Lease, effect: SideEffect) -> None:
    """What the runtime does when an outcome is unknown: fail the attempt so."""
    services.attempt_fail(
        **epochs(lease),
        error={
            "class": "side_effect_unknown",
            "type": "SideEffectUnknown",
            "message": f"{effect.tool} on {effect.target}: outcome unknown",
            "step": effect.step_id,
        },
    )


def events(run_id: str, prefix: str = "side_effect.") -> list[tuple[str, dict[str, Any]]]:
    return [
        (e.type, e.payload)
        for e in RunEvent.objects.filter(run_id=run_id, type__startswith=prefix).order_by("seq")
    ]


def event_types(run_id: str, prefix: str = "side_effect.") -> list[str]:
    return [t for t, _ in events(run_id, prefix)]
