"""Who a remote worker is: the ``Holdpoint-Worker-*`` headers of every worker call
(docs/protocol.md, identity), recorded as its presence (``runs.services.worker_seen``,
at a bounded rate) for the Workers page and for the runs that wait for a worker.

A call without ``Holdpoint-Worker-Name`` (a worker written before the headers, or by
hand) is still recorded at its claims, named after the claim's ``worker_id``. Headers
that break a limit are refused with 400 ``malformed_request`` before anything is done.
"""

from __future__ import annotations

import math
import time
from typing import Any

from rest_framework.request import Request

from api.memo import ProcessMemo
from runs import services
from runs.errors import HoldpointError
from runs.models import WorkerToken
from runs.services import workers
from runs.workers import (
    MAX_AGENTS,
    MAX_CLIENT,
    TOUCH_SECONDS,
    Identity,
    identity_problem,
    principal_for_token,
    worker_name_of,
)

HEADERS = {
    "name": "Holdpoint-Worker-Name",
    "client": "Holdpoint-Worker-Client",
    "host": "Holdpoint-Worker-Host",
    "pid": "Holdpoint-Worker-Pid",
    "concurrency": "Holdpoint-Worker-Concurrency",
    "agents": "Holdpoint-Worker-Agents",
    "lease": "Holdpoint-Worker-Lease-Seconds",
    "wait": "Holdpoint-Worker-Wait-Seconds",
}
# A header longer than this is refused before it is split (the agents: 100 names of 100).
MAX_HEADER = MAX_AGENTS * 101


def _header(request: Request, which: str) -> str:
    value = request.headers.get(HEADERS[which], "")
    if len(value) > MAX_HEADER:
        raise _malformed(f"{HEADERS[which]} is longer than {MAX_HEADER} characters.")
    return value.strip()


def _malformed(detail: str) -> HoldpointError:
    return HoldpointError("malformed_request", detail)


def _number(request: Request, which: str, *, integer: bool) -> float | None:
    raw = _header(request, which)
    if not raw:
        return None
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        raise _malformed(f"{HEADERS[which]} must be a number.") from None
    if not math.isfinite(value) or value < 0 or value > 2**31:
        raise _malformed(f"{HEADERS[which]} is out of range.")
    return value


# Per process: the identity parsed from each set of headers, and when it was last written
# (worker_seen returned True). A worker sends the same headers on every call, so a call
# parses and checks them once, and between two writes TOUCH_SECONDS apart calls do not even
# ask worker_seen: once the interval is over they ask again on each call until it writes,
# so a contact is written as soon as before (runs/workers.py). Forgotten when
# runs.services.workers forgets workers.
seen: ProcessMemo[tuple[str, ...], tuple[Identity, float]] = ProcessMemo(
    10_000, lambda: workers.forgotten
)


def _raw_key(request: Request) -> tuple[str, ...]:
    assert isinstance(request.auth, WorkerToken)
    return (request.auth.name, *(request.headers.get(h, "") for h in HEADERS.values()))


def identity_from_headers(request: Request) -> Identity | None:
    """The identity the request's headers state, or None without ``Holdpoint-Worker-Name``.
    Raise ``malformed_request`` when a header breaks its limit."""
    name = _header(request, "name")
    if not name:
        return None
    assert isinstance(request.auth, WorkerToken)
    known = seen.get(_raw_key(request))
    if known is not None:
        return known[0]
    client, _slash, version = _header(request, "client").rpartition("/")
    if not client:  # no version given: the whole value is the client's name
        client, version = version, ""
    pid = _number(request, "pid", integer=True)
    concurrency = _number(request, "concurrency", integer=True)
    lease = _number(request, "lease", integer=False)
    wait = _number(request, "wait", integer=False)
    agents = tuple(a.strip() for a in _header(request, "agents").split(",") if a.strip())
    identity = Identity(
        name=name,
        principal=principal_for_token(request.auth.name),
        client=client[:MAX_CLIENT],
        client_version=version,
        host=_header(request, "host"),
        pid=None if pid is None else int(pid),
        concurrency=1 if concurrency is None else int(concurrency),
        agents=agents,
        lease_seconds=lease or 0.0,
        wait_seconds=wait or 0.0,
    )
    problem = identity_problem(identity)
    if problem is not None:
        raise _malformed(problem)
    seen.put(_raw_key(request), (identity, -math.inf))
    return identity


def identity_from_claim(request: Request, data: dict[str, Any]) -> Identity:
    """A claim without identity headers: its ``worker_id`` names the worker."""
    assert isinstance(request.auth, WorkerToken)
    return Identity(
        name=worker_name_of(str(data["worker_id"])),
        principal=principal_for_token(request.auth.name),
        agents=tuple(data.get("agents") or ())[:MAX_AGENTS],
        lease_seconds=float(data.get("lease_seconds") or 0.0),
        wait_seconds=float(data.get("wait") or 0.0),
    )


def record_identity(identity: Identity, request: Request | None = None) -> None:
    """Record the worker's contact (bounded: most calls write nothing). With the
    ``request`` its headers came from, a call within ``TOUCH_SECONDS`` of this process's
    last write of them asks nothing (``seen``)."""
    key = _raw_key(request) if request is not None else None
    now = time.monotonic()
    if key is not None:
        known = seen.get(key)
        if known is not None and now - known[1] < TOUCH_SECONDS:
            return
    try:
        written = services.worker_seen(identity=identity)
    except ValueError as exc:  # a limit the headers' checks did not cover
        raise _malformed(str(exc)) from exc
    if written and key is not None:
        seen.put(key, (identity, now))
