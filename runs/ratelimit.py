"""Rate limits and the sign-in lockout, counted in Django's cache.

One rule serves the API's throttles (``api.throttles``), the failed-token counter
of ``api.authentication`` and the sign-in lockout (``LockoutModelBackend``, the login
form of ``dashboard.views.login``).

Why the cache and not django-axes: the rule is a few counters, and it must behave the
same on every deployment Holdpoint supports. The cache is ``settings.CACHES["default"]``:
Redis when ``REDIS_URL`` is set, else the PostgreSQL table ``holdpoint_cache`` when
``DATABASE_URL`` is set, else the process's memory in the zero-setup single-process mode
(``HOLDPOINT_CACHE`` picks one explicitly). Several web processes must share Redis or the
database, or each would count on its own.

Counting is a fixed window: ``limit`` hits per window of ``seconds`` aligned to the clock,
one counter per window (``add`` then ``incr``: atomic on Redis and in memory). Whether a
window or a lock is over is decided from timestamps stored in the keys and values, never
from the cache's own expiry, so ``time_machine`` moves every backend alike; the expiry
only cleans up.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from runs.permissions import user_with_permissions
from runs.rates import parse_rate

PREFIX = "hp:rl"


@dataclass(frozen=True)
class Verdict:
    """The answer to one counted hit: whether it is within the limit, and when the window
    ends (seconds, at least 1)."""

    allowed: bool
    retry_after: int
    count: int


def _digest(ident: str) -> str:
    # Keys of any backend: short, no spaces or control characters, whatever was typed.
    return hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def rate_for(setting: str) -> tuple[int, int] | None:
    """The ``(limit, seconds)`` of a rate setting such as ``HOLDPOINT_THROTTLE_USER``."""
    return parse_rate(str(getattr(settings, setting)))


def hit(scope: str, ident: str, rate: tuple[int, int]) -> Verdict:
    """Count one hit of ``ident`` in ``scope`` against ``rate`` = ``(limit, seconds)``."""
    limit, seconds = rate
    now = time.time()
    window = int(now // seconds)
    key = f"{PREFIX}:{scope}:{_digest(ident)}:{window}"
    incr_window = getattr(cache, "incr_window", None)
    if incr_window is not None:  # Redis (runs.cache): one round trip.
        count = incr_window(key, seconds + 1)
    else:
        cache.add(key, 0, timeout=seconds + 1)
        try:
            count = cache.incr(key)
        except ValueError:  # Evicted between add and incr: this is the window's first hit.
            cache.set(key, 1, timeout=seconds + 1)
            count = 1
    retry_after = max(1, math.ceil((window + 1) * seconds - now))
    return Verdict(allowed=count <= limit, retry_after=retry_after, count=count)


def _peek(scope: str, ident: str, rate: tuple[int, int]) -> Verdict:
    """Like ``hit`` without counting: whether the next hit would still be allowed."""
    limit, seconds = rate
    now = time.time()
    window = int(now // seconds)
    count = cache.get(f"{PREFIX}:{scope}:{_digest(ident)}:{window}") or 0
    retry_after = max(1, math.ceil((window + 1) * seconds - now))
    return Verdict(allowed=count < limit, retry_after=retry_after, count=count)


def client_address(request: HttpRequest | Any) -> str:
    """The client's address. Behind a reverse proxy the server's ``--proxy-headers`` puts
    the client's address here (Procfile, deploy/systemd); Holdpoint never reads
    X-Forwarded-For itself, which any client can write."""
    meta = getattr(request, "META", None) or {}
    return str(meta.get("REMOTE_ADDR") or "unknown")


# --- Requests without credentials ---------------------------------------------------------------

_ANON_COUNTED = "_holdpoint_anonymous_counted"


def anonymous_hit(request: Any) -> int | None:
    """Count a request without credentials against its address, once per request; return
    the seconds to wait when it is over ``HOLDPOINT_THROTTLE_ANON``, else None."""
    django_request = getattr(request, "_request", request)
    if getattr(django_request, _ANON_COUNTED, False):
        return None
    setattr(django_request, _ANON_COUNTED, True)
    rate = rate_for("HOLDPOINT_THROTTLE_ANON")
    if rate is None:
        return None
    verdict = hit("api:anon", client_address(request), rate)
    return None if verdict.allowed else verdict.retry_after


# --- Failed tokens ----------------------------------------------------------------------------


def auth_failures_blocked(address: str) -> int | None:
    """Seconds until ``address`` may present a token again, or None when it may now."""
    rate = rate_for("HOLDPOINT_THROTTLE_AUTH_FAILURES")
    if rate is None:
        return None
    verdict = _peek("auth-fail", address, rate)
    return None if verdict.allowed else verdict.retry_after


def auth_failure_record(address: str) -> None:
    rate = rate_for("HOLDPOINT_THROTTLE_AUTH_FAILURES")
    if rate is not None:
        hit("auth-fail", address, rate)


# --- Sign-in lockout --------------------------------------------------------------------------


def _account(username: str) -> str:
    # "Alice" and "alice " are one account to count, so case and spaces do not reset it.
    return username.strip().casefold()


def _lock_key(kind: str, ident: str) -> str:
    return f"{PREFIX}:login-lock:{kind}:{_digest(ident)}"


def login_lockout_remaining(*, username: str | None, address: str) -> int | None:
    """Seconds left of a lockout of this account or this address, or None."""
    now = time.time()
    keys = [_lock_key("address", address)]
    if username:
        keys.append(_lock_key("account", _account(username)))
    until = max((float(v) for v in cache.get_many(keys).values()), default=0.0)
    return math.ceil(until - now) if until > now else None


def login_failure_record(*, username: str, address: str) -> int | None:
    """Count a failed sign-in for the account and the address; lock either one that went
    over its limit for ``HOLDPOINT_LOGIN_LOCKOUT_SECONDS``. Returns the seconds of a
    lockout this failure started, or None."""
    lockout = int(settings.HOLDPOINT_LOGIN_LOCKOUT_SECONDS)
    started = None
    for kind, ident, setting in (
        ("account", _account(username), "HOLDPOINT_LOGIN_FAILURES_PER_ACCOUNT"),
        ("address", address, "HOLDPOINT_LOGIN_FAILURES_PER_ADDRESS"),
    ):
        limit = int(getattr(settings, setting))
        if limit <= 0:
            continue
        # Failures are counted over the lockout period: N failures within it lock for it.
        verdict = hit(f"login-fail:{kind}", ident, (limit, lockout))
        if verdict.count >= limit:
            cache.set(_lock_key(kind, ident), time.time() + lockout, timeout=lockout + 1)
            started = lockout
    return started


class LockoutModelBackend(ModelBackend):
    """Django's ModelBackend behind the lockout, for every sign-in form (ours and the admin's).

    A locked account or address is refused whatever the password: ``PermissionDenied``
    stops ``authenticate()`` at this backend. The login page tells the person why and when
    to come back (``dashboard.views.login``); the admin shows its generic error.
    """

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        address = client_address(request)
        if login_lockout_remaining(username=username, address=address) is not None:
            raise PermissionDenied("Too many failed sign-ins; locked for now.")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            login_failure_record(username=username, address=address)
        return user

    def get_user(self, user_id: Any) -> Any:
        """The signed-in user of a session, with their permission set, in one query
        (``runs.permissions``): ``has_perm`` then asks nothing more for the request. The
        permission methods stay ModelBackend's (``live.sessions`` relies on it)."""
        user = user_with_permissions(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None
