"""Authentication for the two APIs.

People and scripts use the control API with a session (browser, CSRF enforced) or
a DRF token (``Authorization: Token …``, ``manage.py drf_create_token USER``).
Workers use the worker API with a worker token (``Authorization: Bearer hpw_…``,
``manage.py workertoken create NAME``). The two never mix: a worker token opens
no control endpoint and a person's token opens no worker endpoint.

Reuse for other worker endpoints (the ledger's side effects)::

    class SideEffectBeginApi(APIView):
        authentication_classes = [WorkerTokenAuthentication]
        permission_classes = [IsWorker]

``request.user`` is then a ``WorkerPrincipal`` (``.name``, ``.principal``) and
``request.auth`` the ``WorkerToken`` row.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone
from django.utils.translation import gettext
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    TokenAuthentication,
    get_authorization_header,
)
from rest_framework.authtoken.models import Token
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from api.memo import ProcessMemo
from runs import db, tokens
from runs.db import postgresql
from runs.models import WorkerToken
from runs.permissions import permission_set, remember_permissions, user_from_row, user_select_sql
from runs.ratelimit import (
    anonymous_hit,
    auth_failure_record,
    auth_failures_blocked,
    client_address,
)
from runs.tokens import hash_token

KEYWORD = b"bearer"
# last_used_at is written at most this often per token, not on every heartbeat.
_LAST_USED_RESOLUTION = dt.timedelta(seconds=60)


@dataclass(frozen=True)
class WorkerPrincipal:
    """The worker behind a worker token; stands in ``request.user`` on the worker API."""

    name: str

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False

    @property
    def pk(self) -> str:
        return self.name

    @property
    def principal(self) -> str:
        """The scope of this worker's Idempotency-Keys."""
        return f"worker:{self.name}"

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return False  # Workers hold no permission of the control API.

    def get_username(self) -> str:
        return f"worker:{self.name}"

    def __str__(self) -> str:
        return self.get_username()


_BLOCKED = "Too many failed authentications from this address; try again in {wait} seconds."


def _presents(request: Request, keyword: bytes) -> bool:
    parts = get_authorization_header(request).split()
    return bool(parts) and parts[0].lower() == keyword


class FailureCountingMixin:
    """Count credentials that fail, per client address; once an address is over
    ``HOLDPOINT_THROTTLE_AUTH_FAILURES``, its failing credentials get 429 ``throttled``
    until the window ends. Guessing tokens is hopeless (256 random bits), but a client
    that keeps trying is told to stop instead of being answered at full speed.

    Only failing credentials meet the block: a valid token from the same address (every
    worker on a host, everyone behind a NAT, the proxy itself when its headers are not
    trusted) is judged by its own principal's rate, never locked out by a neighbour's
    typo. The token is looked up first, which costs one indexed query per refused try.
    (Passwords are another matter: the sign-in lockout, ``runs/ratelimit.py``, refuses a
    locked address before checking, or a locked-out guesser could still test passwords.)"""

    presented_keyword: bytes

    def _guarded(self, request: Request, check: Any) -> Any:
        if not _presents(request, self.presented_keyword):
            return check()
        try:
            return check()
        except exceptions.AuthenticationFailed:
            address = client_address(request)
            wait = auth_failures_blocked(address)
            if wait is not None:
                raise exceptions.Throttled(wait=wait, detail=_BLOCKED.format(wait=wait)) from None
            auth_failure_record(address)
            raise


def _token_query() -> tuple[str, list[str]]:
    """The token, its user and the user's permissions in one statement (PostgreSQL)."""
    select, attnames = user_select_sql("u")
    table, users = Token._meta.db_table, User._meta.db_table
    sql = (
        f'SELECT t."created", {select} FROM "{table}" t '  # noqa: S608 - names from the models
        f'JOIN "{users}" u ON u."id" = t."user_id" WHERE t."key" = %s'
    )
    return sql, attnames


_TOKEN_QUERY: tuple[str, list[str]] | None = None


class ThrottledTokenAuthentication(FailureCountingMixin, TokenAuthentication):
    """DRF's ``Authorization: Token …`` (people and scripts), with failures counted.

    On PostgreSQL the token, its user and the user's permission set are one statement;
    ``has_perm`` then asks the database nothing for the rest of the request
    (``runs.permissions``)."""

    presented_keyword = b"token"

    def authenticate(self, request: Request) -> Any:
        return self._guarded(request, lambda: TokenAuthentication.authenticate(self, request))

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        global _TOKEN_QUERY
        if not postgresql():
            # Elsewhere (SQLite): DRF's token and user, then the permission set in one query.
            user, token = super().authenticate_credentials(key)
            if not user.is_superuser:
                remember_permissions(user, permission_set(user))
            return user, token
        if _TOKEN_QUERY is None:
            _TOKEN_QUERY = _token_query()
        sql, attnames = _TOKEN_QUERY
        with connection.cursor() as cursor:
            cursor.execute(sql, [key])
            row = cursor.fetchone()
        if row is None:
            raise exceptions.AuthenticationFailed(gettext("Invalid token."))
        user = user_from_row(row[1:], attnames)
        if not user.is_active:
            raise exceptions.AuthenticationFailed(gettext("User inactive or deleted."))
        token = Token(key=key, user_id=user.pk, created=row[0])
        token._state.adding = False
        token._state.db = connection.alias
        token.user = user
        return user, token


# Worker tokens this process looked up, by hash, each with when (monotonic clock), trusted
# for HOLDPOINT_WORKER_TOKEN_CACHE_SECONDS: every worker call authenticates, and the look-up
# was a query of its own on each. The bound on revocation: a token revoked in this process
# is forgotten at once (runs.tokens.revocations); one revoked elsewhere (another web
# process, the command line) is refused here at most that many seconds later. Unknown or
# revoked tokens are never kept: a failing credential is looked up and counted every time.
worker_tokens: ProcessMemo[str, tuple[float, WorkerToken]] = ProcessMemo(
    1000, lambda: tokens.revocations
)


def _active_worker_token(token_hash: str) -> WorkerToken | None:
    ttl = float(settings.HOLDPOINT_WORKER_TOKEN_CACHE_SECONDS)
    kept = worker_tokens.get(token_hash)
    if kept is not None and ttl > 0 and time.monotonic() - kept[0] < ttl:
        return kept[1]
    found = _look_up_worker_token(token_hash)
    if found is not None and ttl > 0:
        worker_tokens.put(token_hash, (time.monotonic(), found))
    return found


def _look_up_worker_token(token_hash: str) -> WorkerToken | None:
    if not postgresql():
        return WorkerToken.objects.filter(token_hash=token_hash, revoked_at__isnull=True).first()
    found = db.fetch(
        WorkerToken,
        f"SELECT {db.columns(WorkerToken, 't')} FROM "  # noqa: S608 - names from the models
        f'"{WorkerToken._meta.db_table}" t WHERE t."token_hash" = %s '
        'AND t."revoked_at" IS NULL LIMIT 1',
        [token_hash],
    )
    return None if found is None else found[0]


class WorkerTokenAuthentication(FailureCountingMixin, BaseAuthentication):
    """``Authorization: Bearer hpw_…`` against the hashed, unrevoked worker tokens."""

    presented_keyword = KEYWORD

    def authenticate(self, request: Request) -> tuple[WorkerPrincipal, WorkerToken] | None:
        result: tuple[WorkerPrincipal, WorkerToken] | None = self._guarded(
            request, lambda: self._authenticate(request)
        )
        return result

    def _authenticate(self, request: Request) -> tuple[WorkerPrincipal, WorkerToken] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != KEYWORD:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("The Bearer header takes exactly one token.")
        try:
            secret = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The token is not ASCII.") from None
        token = _active_worker_token(hash_token(secret))
        if token is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked worker token.")
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > _LAST_USED_RESOLUTION:
            WorkerToken.objects.filter(pk=token.pk).update(last_used_at=now)
            # The cached row says so too, or every call after a minute would write again.
            token.last_used_at = now
        return WorkerPrincipal(name=token.name), token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="holdpoint-worker"'


class AnonymousRateAuthentication(BaseAuthentication):
    """The last authenticator: no credentials claimed the request, so count it against the
    client's address (``HOLDPOINT_THROTTLE_ANON``) here, before a permission check answers
    401. DRF checks permissions before throttles, so a throttle alone would never see an
    anonymous request to a protected endpoint. Authenticates nobody."""

    def authenticate(self, request: Request) -> None:
        # Credentials this endpoint does not take (a person's token on the worker API, a
        # worker's on the control API) count as a failure and meet the block of an address
        # that keeps failing.
        if get_authorization_header(request):
            address = client_address(request)
            blocked = auth_failures_blocked(address)
            if blocked is not None:
                raise exceptions.Throttled(wait=blocked, detail=_BLOCKED.format(wait=blocked))
            auth_failure_record(address)
        wait = anonymous_hit(request)
        if wait is not None:
            raise exceptions.Throttled(wait=wait)
        return None


class IsWorker(BasePermission):
    """Only a request authenticated by a worker token passes."""

    message = "This endpoint is for workers; authenticate with a worker token."

    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.user, WorkerPrincipal) and isinstance(request.auth, WorkerToken)


class CsrfSessionAuthentication(SessionAuthentication):
    """Session authentication whose CSRF refusal carries its own code (``csrf_failed``)."""

    def enforce_csrf(self, request: Request) -> None:
        try:
            super().enforce_csrf(request)
        except exceptions.PermissionDenied as exc:
            raise exceptions.PermissionDenied(str(exc.detail), code="csrf_failed") from None


class WorkerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.WorkerTokenAuthentication"
    name = "workerToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A worker token from `python manage.py workertoken create NAME`.",
        }


class CsrfSessionScheme(OpenApiAuthenticationExtension):
    target_class = "api.authentication.CsrfSessionAuthentication"
    name = "cookieAuth"
    priority = -1

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "apiKey", "in": "cookie", "name": "sessionid"}
