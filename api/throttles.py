"""The API's throttle: one class, three scopes, every endpoint (``DEFAULT_THROTTLE_CLASSES``).

- ``worker``: a request with a worker token, counted per token (all the workers that
  share it): ``HOLDPOINT_THROTTLE_WORKER``.
- ``user``: a person (session or DRF token), counted per person: ``HOLDPOINT_THROTTLE_USER``.
- ``anon``: no credentials, counted per client address: ``HOLDPOINT_THROTTLE_ANON``;
  usually already counted by ``AnonymousRateAuthentication`` before the permission check
  (``runs.ratelimit.anonymous_hit`` counts a request once).

A request over its rate is refused with 429, ``code: throttled`` and ``Retry-After``
(``api.problems``). Credentials that fail are counted apart, per address, before any
of these (``api.authentication``): a wrong token never reaches the throttle.

The defaults are far above what a person, the demo (``make run``) or the benchmarks and
chaos harness send, including heartbeats of many workers sharing one token; they stop a
runaway script, not a busy day. Tests set low rates explicitly with ``settings``.
"""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from api.authentication import WorkerPrincipal
from runs.ratelimit import anonymous_hit, hit, rate_for


def throttle_scope(request: Request) -> tuple[str, str] | None:
    """``(scope, ident)`` of an authenticated request's principal, None when anonymous."""
    user = request.user
    if isinstance(user, WorkerPrincipal):
        return "worker", f"token:{getattr(request.auth, 'pk', user.name)}"
    if user is not None and user.is_authenticated:
        return "user", f"user:{user.pk}"
    return None


SETTINGS = {"worker": "HOLDPOINT_THROTTLE_WORKER", "user": "HOLDPOINT_THROTTLE_USER"}


class PrincipalRateThrottle(BaseThrottle):
    """Fixed-window rate per principal (``runs.ratelimit.hit``)."""

    def __init__(self) -> None:
        self._wait: int | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        principal = throttle_scope(request)
        if principal is None:
            self._wait = anonymous_hit(request)
            return self._wait is None
        scope, ident = principal
        rate = rate_for(SETTINGS[scope])
        if rate is None:
            return True
        verdict = hit(f"api:{scope}", ident, rate)
        self._wait = verdict.retry_after
        return verdict.allowed

    def wait(self) -> float | None:
        return self._wait
