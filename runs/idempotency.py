"""Idempotency keys for POST requests (docs/api.md, Idempotency-Key), independent of any framework.

The DRF mixin (``api.idempotency.IdempotentMixin``) and the dashboard's forms
both call ``idempotent_call``; the rules live here once.

How "in progress" is made durable without a transaction held across the work:

1. **Claim.** The first request INSERTs an ``in_progress`` record in its own short,
   committed transaction. The unique constraint on (principal, key) decides who is
   first: on PostgreSQL a concurrent INSERT of the same key waits for the winner's
   commit and then fails; the loser reads the committed row under a row lock.
2. **Work.** The service runs in its own (durable) transaction, outside any
   transaction of ours, so its on-commit signals fire as usual.
3. **Store.** The response is written to the record, but only by the caller that
   still holds the record (``owner``), in one UPDATE. A response with status 5xx is
   not stored: the record is deleted, so a retry with the same key runs again.

A process that dies between 1 and 3 leaves an ``in_progress`` record. Its
in-progress lease (``locked_until``, ``HOLDPOINT_IDEMPOTENCY_IN_PROGRESS_SECONDS``)
then runs out: the next request with the key takes the record over and runs, and
the ``idempotency_records`` sweep deletes such orphans, so after a sweep no
in-progress record outlives its lease. If the crash fell between the service's
commit and step 3, the retry runs the service again: the control operations are
compare-and-set, so it is refused with the 409 that says what happened
(``request_mismatch`` "already answered by …", ``invalid_state``), never applied
twice. ``POST /api/runs`` is the one call that could then create a second run;
that window is one UPDATE long.

Completed records live ``HOLDPOINT_IDEMPOTENCY_RETENTION_SECONDS`` (24 h by
default); the sweep removes them after that, and an expired record that is still
there counts as absent.

**In one transaction** (``in_transaction=True``, PostgreSQL): when ``execute`` is one
service call whose only effects are rows (the control operations, and a worker's
heartbeat, checkpoint and interrupt; never a call that reaches outside the database,
such as the ledger's), the record is written as
``completed`` in the service's own transaction, after its work and before its commit
(services join it through ``joinable``). One commit instead of three, and no
in-progress record at all: the unique constraint still decides who is first. A key
that a record already holds is looked up first and answered through the general path
above (the stored answer, a 422 for another request, a 409 while an older in-progress
record holds the key), without doing the work. A second request that arrives while the
first is still in its transaction does its work too, but its INSERT waits for the first
one's commit, finds the key taken, and rolls its own work back; it then answers through
the general path. A refusal (4xx) rolls the work back
and is stored on its own in one statement; a 5xx or an exception stores nothing.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import logging
import math
import secrets
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.db.models.functions import Now

from runs.db import db_now, fetch_rows, postgresql
from runs.errors import HoldpointError
from runs.models import IdempotencyRecord
from runs.schemas import canonical_json

logger = logging.getLogger(__name__)

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255

State = IdempotencyRecord.State


@dataclass(frozen=True)
class StoredResponse:
    """A response as the client received it: replayed byte for byte."""

    status: int
    body: bytes
    content_type: str


def retention_seconds() -> int:
    return int(settings.HOLDPOINT_IDEMPOTENCY_RETENTION_SECONDS)


def in_progress_seconds() -> float:
    return float(getattr(settings, "HOLDPOINT_IDEMPOTENCY_IN_PROGRESS_SECONDS", 60))


def principal_for_user(user: Any) -> str:
    """The scope of a person's keys: two people never share a key."""
    return f"user:{user.pk}"


def principal_for_worker(name: str) -> str:
    return f"worker:{name}"


def request_fingerprint(*, method: str, path: str, body: Any) -> str:
    """sha256 of method, path and canonical JSON body (key order and whitespace do not count)."""
    raw = "\x00".join([method.upper(), path, canonical_json(body)])
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


# --- The header ------------------------------------------------------------------------------


def _malformed(why: str) -> HoldpointError:
    return HoldpointError(
        "idempotency_key_malformed",
        f"The {HEADER} header is malformed: {why}. Send one key of 1 to {MAX_KEY_LENGTH} "
        'printable ASCII characters, bare or as a quoted string ("abc").',
    )


def _split_members(value: str) -> list[str]:
    """Split a field value on the commas that separate list members (RFC 9110 5.6.1).

    Servers join repeated header lines with commas before Django sees them, so two
    ``Idempotency-Key`` lines arrive as one value with two members.
    """
    members: list[str] = []
    current: list[str] = []
    in_quotes = escaped = False
    for char in value:
        if in_quotes:
            current.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_quotes = False
        elif char == '"':
            in_quotes = True
            current.append(char)
        elif char == ",":
            members.append("".join(current))
            current = []
        else:
            current.append(char)
    members.append("".join(current))
    return [m.strip(" \t") for m in members]


def _unquote(member: str) -> str:
    """Parse an RFC 8941 sf-string (``"abc"``, with ``\\"`` and ``\\\\`` escapes)."""
    chars: list[str] = []
    index = 1
    while index < len(member):
        char = member[index]
        if char == "\\":
            if index + 1 >= len(member) or member[index + 1] not in '"\\':
                raise _malformed("a backslash may only escape a quote or a backslash")
            chars.append(member[index + 1])
            index += 2
            continue
        if char == '"':
            if index != len(member) - 1:
                raise _malformed("nothing may follow the closing quote")
            return "".join(chars)
        chars.append(char)
        index += 1
    raise _malformed("the quoted string is not closed")


def parse_idempotency_key(header_values: list[str]) -> str:
    """Return the key carried by the ``Idempotency-Key`` header lines ``header_values``.

    Raises ``idempotency_key_missing`` when there is none and ``idempotency_key_malformed``
    when it is not exactly one key of 1-255 printable ASCII characters. The quoted
    structured-field form ``"abc"`` is the same key as ``abc``.
    """
    if not header_values:
        raise HoldpointError(
            "idempotency_key_missing",
            f"This operation needs an {HEADER} header: a fresh random key per operation, "
            "sent again unchanged when you retry it.",
        )
    members = [m for value in header_values for m in _split_members(value)]
    if len(members) != 1:
        raise _malformed("it carries more than one key")
    member = members[0]
    key = _unquote(member) if member.startswith('"') else member
    if not key:
        raise _malformed("the key is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise _malformed(f"the key is longer than {MAX_KEY_LENGTH} characters")
    if not all(" " <= char <= "~" for char in key):
        raise _malformed("the key contains characters other than printable ASCII")
    return key


# --- The record --------------------------------------------------------------------------------


_INSERT_FRESH_KEY = """
INSERT INTO runs_idempotencyrecord (principal, key, fingerprint, method, path, state, owner,
    locked_until, response_status, response_body, response_content_type,
    created_at, completed_at, expires_at)
VALUES (%s, %s, %s, %s, %s, %s, %s,
    statement_timestamp() + make_interval(secs => %s), NULL, NULL, '',
    statement_timestamp(), NULL, statement_timestamp() + make_interval(secs => %s))
ON CONFLICT (principal, key) DO NOTHING
RETURNING id
"""


def _claim_fresh_key(
    *, principal: str, key: str, fingerprint: str, method: str, path: str, owner: str
) -> bool:
    """The common case in one statement: INSERT the record unless the key exists.

    On PostgreSQL, outside any transaction, ``INSERT … ON CONFLICT DO NOTHING`` is one
    round trip and one commit, where the general path below takes six statements
    (BEGIN, the clock, SAVEPOINT, INSERT, RELEASE, COMMIT); a fresh key is by far the
    most frequent case, and this was a quarter of the statements of a control request
    (bench/control_ops.py). The unique constraint still decides who is first: a
    concurrent INSERT of the same key waits for this commit and then does nothing.
    Times come from the database's clock, as in ``_claim``. Return True when the key
    was free and is now ours; False sends the caller down the general path.
    """
    if not postgresql() or connection.in_atomic_block:
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            _INSERT_FRESH_KEY,
            [
                principal,
                key,
                fingerprint,
                method.upper()[:10],
                path[:2000],
                State.IN_PROGRESS,
                owner,
                in_progress_seconds(),
                retention_seconds(),
            ],
        )
        return cursor.fetchone() is not None


def _claim(
    *, principal: str, key: str, fingerprint: str, method: str, path: str
) -> str | StoredResponse:
    """Take the key for this request (return the owner token) or return the stored response.

    Runs in its own committed transaction, so that the record says "in progress" to
    every other process before the work starts.
    """
    owner = secrets.token_hex(16)
    if _claim_fresh_key(
        principal=principal, key=key, fingerprint=fingerprint, method=method, path=path, owner=owner
    ):
        return owner
    with transaction.atomic(durable=True):
        now = db_now()
        locked_until = now + dt.timedelta(seconds=in_progress_seconds())
        fresh = {
            "fingerprint": fingerprint,
            "method": method.upper()[:10],
            "path": path[:2000],
            "state": State.IN_PROGRESS,
            "owner": owner,
            "locked_until": locked_until,
            "response_status": None,
            "response_body": None,
            "response_content_type": "",
            "created_at": now,
            "completed_at": None,
            "expires_at": now + dt.timedelta(seconds=retention_seconds()),
        }
        try:
            # The savepoint lets the transaction go on after a lost race for the key.
            with transaction.atomic():
                IdempotencyRecord.objects.create(principal=principal, key=key, **fresh)
            return owner
        except IntegrityError:
            pass
        # Someone was first. The row lock orders us after any takeover in flight.
        record = (
            IdempotencyRecord.objects.select_for_update()
            .filter(principal=principal, key=key)
            .first()
        )
        if record is None or record.expires_at <= now:
            # Purged or expired since: the key is free again. (A purge between our failed
            # INSERT and this read is the only way to get None; we insert anew.)
            if record is None:
                try:
                    with transaction.atomic():
                        IdempotencyRecord.objects.create(principal=principal, key=key, **fresh)
                except IntegrityError:
                    raise HoldpointError(
                        "idempotency_in_progress",
                        "Another request with this key has just started; send it again.",
                        retry_after=1,
                    ) from None
            else:
                for name, value in fresh.items():
                    setattr(record, name, value)
                record.save()
            return owner
        if record.fingerprint != fingerprint:
            raise HoldpointError(
                "idempotency_key_reused",
                f"This {HEADER} was already used for a different request "
                f"({record.method} {record.path}); use a new key for a new operation.",
                first_request={"method": record.method, "path": record.path},
            )
        if record.state == State.COMPLETED:
            assert record.response_status is not None
            return StoredResponse(
                status=record.response_status,
                body=bytes(record.response_body or b""),
                content_type=record.response_content_type,
            )
        assert record.locked_until is not None
        if record.locked_until > now:
            wait = max(1, math.ceil((record.locked_until - now).total_seconds()))
            raise HoldpointError(
                "idempotency_in_progress",
                "The first request with this key is still being processed; "
                f"send it again in {wait} s to get its answer.",
                retry_after=wait,
            )
        # The first caller held the key past its in-progress lease: it crashed. Take over.
        logger.warning(
            "idempotency: taking over %s key %r, in progress since %s",
            principal,
            key,
            record.created_at.isoformat(),
        )
        record.owner = owner
        record.locked_until = locked_until
        record.save(update_fields=["owner", "locked_until"])
        return owner


def _store(*, principal: str, key: str, owner: str, response: StoredResponse) -> None:
    stored = IdempotencyRecord.objects.filter(
        principal=principal, key=key, owner=owner, state=State.IN_PROGRESS
    ).update(
        state=State.COMPLETED,
        response_status=response.status,
        response_body=response.body,
        response_content_type=response.content_type,
        # The database's clock, in the same statement: no round trip just to read it.
        completed_at=Now(),
        locked_until=None,
    )
    if not stored:
        # Our in-progress lease ran out and another request took the key over (or the
        # sweep removed it). That request answers for the key from now on.
        logger.warning("idempotency: %s key %r was taken over before it completed", principal, key)


def _release(*, principal: str, key: str, owner: str) -> None:
    IdempotencyRecord.objects.filter(
        principal=principal, key=key, owner=owner, state=State.IN_PROGRESS
    ).delete()


# --- In the service's transaction ---------------------------------------------------------------

_joined: ContextVar[bool] = ContextVar("holdpoint_idempotency_joined", default=False)

F = TypeVar("F", bound=Callable[..., Any])


def joinable(func: F) -> F:
    """A service's transaction: durable (``transaction.atomic(durable=True)``: its on-commit
    signals run when it returns), except inside ``idempotent_call(in_transaction=True)``,
    whose transaction it then joins (the record is written before that one commits)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _joined.get():
            with transaction.atomic(savepoint=False):
                return func(*args, **kwargs)
        with transaction.atomic(durable=True):
            return func(*args, **kwargs)

    return cast(F, wrapper)


_INSERT_COMPLETED = """
INSERT INTO runs_idempotencyrecord AS r (principal, key, fingerprint, method, path, state,
    owner, locked_until, response_status, response_body, response_content_type,
    created_at, completed_at, expires_at)
VALUES (%s, %s, %s, %s, %s, %s, '', NULL, %s, %s, %s,
    statement_timestamp(), statement_timestamp(),
    statement_timestamp() + make_interval(secs => %s))
ON CONFLICT (principal, key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
    method = EXCLUDED.method, path = EXCLUDED.path, state = EXCLUDED.state, owner = '',
    locked_until = NULL, response_status = EXCLUDED.response_status,
    response_body = EXCLUDED.response_body,
    response_content_type = EXCLUDED.response_content_type,
    created_at = EXCLUDED.created_at, completed_at = EXCLUDED.completed_at,
    expires_at = EXCLUDED.expires_at
WHERE r.expires_at <= statement_timestamp()
RETURNING id
"""


def _insert_completed(
    *, principal: str, key: str, fingerprint: str, method: str, path: str, response: StoredResponse
) -> bool:
    """Store ``response`` for a free key (absent, or expired: it counts as absent) in one
    statement; False when the key is held by a live record."""
    with connection.cursor() as cursor:
        cursor.execute(
            _INSERT_COMPLETED,
            [
                principal,
                key,
                fingerprint,
                method.upper()[:10],
                path[:2000],
                State.COMPLETED,
                response.status,
                response.body,
                response.content_type,
                retention_seconds(),
            ],
        )
        return cursor.fetchone() is not None


class _Undo(Exception):
    def __init__(self, response: StoredResponse | None) -> None:
        self.response = response


def _only_test_transactions() -> bool:
    return all(getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


def _key_in_use(*, principal: str, key: str) -> bool:
    """Whether a live record holds the key: then the general path answers (the stored
    response, 422 for another request, 409 while in progress) without doing the work.
    Doing it first would run a service for a request that the key already refuses: an
    approver who sends their earlier key with another decision would change the run's
    votes before the 422 rolled them back, or hit a constraint and answer 500."""
    if postgresql():
        # Every keyed write asks this: one plain statement, no queryset to compile.
        return fetch_rows(_KEY_IN_USE, [principal, key])[0] is not None
    return IdempotencyRecord.objects.filter(
        principal=principal, key=key, expires_at__gt=Now()
    ).exists()


_KEY_IN_USE = """
SELECT 1 FROM runs_idempotencyrecord
WHERE principal = %s AND key = %s AND expires_at > statement_timestamp()
"""


def _call_in_transaction(
    *,
    principal: str,
    key: str,
    fingerprint: str,
    method: str,
    path: str,
    execute: Callable[[], StoredResponse],
) -> tuple[StoredResponse, bool] | None:
    """``execute`` and the record in one transaction; None: the key is taken, answer through
    the general path (our work was rolled back)."""
    record = {
        "principal": principal,
        "key": key,
        "fingerprint": fingerprint,
        "method": method,
        "path": path,
    }
    token = _joined.set(True)
    try:
        with transaction.atomic(durable=True):
            response = execute()
            # A service that refused marked the transaction for rollback (it joined it).
            if connection.needs_rollback or response.status >= 500:
                raise _Undo(response)
            if not _insert_completed(**record, response=response):
                raise _Undo(None)
        return response, False
    except _Undo as undo:
        refused = undo.response
    finally:
        _joined.reset(token)
    if refused is None:
        return None
    if refused.status >= 500:
        return refused, False
    # A refusal is the answer to this request: stored (its work, if any, is rolled back).
    with transaction.atomic(durable=True):
        if _insert_completed(**record, response=refused):
            return refused, False
    return None


def idempotent_call(
    *,
    principal: str,
    key: str,
    method: str,
    path: str,
    body: Any,
    execute: Callable[[], StoredResponse],
    in_transaction: bool = False,
) -> tuple[StoredResponse, bool]:
    """Run ``execute`` at most once per (principal, key); return (response, replayed).

    ``execute`` returns the response to keep, refusals included (a 409 from a
    service is the answer to that request and is replayed as such). It must not be
    called inside a transaction: it runs after the record's own commit, or, with
    ``in_transaction``, in the record's transaction (services decorated ``joinable``
    join it; see the module's docstring for when that is allowed). When it raises,
    or answers 5xx, nothing is stored and the key is free again.

    Raises ``HoldpointError``: ``idempotency_key_reused`` (422) when the key was used
    for a different method, path or body; ``idempotency_in_progress`` (409, with
    ``extra["retry_after"]`` seconds) while the first request is still running.
    """
    fingerprint = request_fingerprint(method=method, path=path, body=body)
    if (
        in_transaction
        and postgresql()
        and _only_test_transactions()
        and not _key_in_use(principal=principal, key=key)
    ):
        done = _call_in_transaction(
            principal=principal,
            key=key,
            fingerprint=fingerprint,
            method=method,
            path=path,
            execute=execute,
        )
        if done is not None:
            return done
    claimed = _claim(
        principal=principal, key=key, fingerprint=fingerprint, method=method, path=path
    )
    if isinstance(claimed, StoredResponse):
        return claimed, True
    owner = claimed
    try:
        response = execute()
    except BaseException:
        _release(principal=principal, key=key, owner=owner)
        raise
    if response.status >= 500:
        _release(principal=principal, key=key, owner=owner)
    else:
        _store(principal=principal, key=key, owner=owner, response=response)
    return response, False


def idempotency_records_purge(*, limit: int = 100) -> int:
    """Delete expired records and in-progress records whose lease ran out (their caller
    crashed). Registered as the ``idempotency_records`` sweep; returns how many went."""
    now = db_now()
    stale = Q(expires_at__lte=now) | Q(state=State.IN_PROGRESS, locked_until__lt=now)
    # Deletes are cheap and records many: take ten times a sweep's usual batch.
    ids = list(IdempotencyRecord.objects.filter(stale).values_list("pk", flat=True)[: limit * 10])
    if not ids:
        return 0
    # The condition again: a record taken over since the read has a new lease and stays.
    deleted, _ = IdempotencyRecord.objects.filter(stale, pk__in=ids).delete()
    return deleted
