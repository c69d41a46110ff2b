"""Shared pieces of the run services: the run lock, the fence, and new attempts."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection

from runs import db
from runs.audit import SESSION, SESSION_SIGN_INS
from runs.db import postgresql, row_now, with_db_now
from runs.errors import HoldpointError
from runs.events import EventType, append_event, notify_work, take_events
from runs.leases import lease_ran_out
from runs.metrics import CONTROL_LATENCY, CONTROL_OPERATIONS, STALE_WRITES
from runs.models import AgentGate, Attempt, Checkpoint, InputRequest, Run, RunEvent
from runs.states import AttemptReason, AttemptStatus, RequestKind, RequestStatus, next_status

UserLike = AbstractBaseUser | AnonymousUser | None


def user_or_none(user: UserLike) -> Any:
    """The user to store on a row (``created_by``, ``answered_by``), or None for the system."""
    return user if user is not None and user.is_authenticated else None


P = ParamSpec("P")
R = TypeVar("R")


def measured(operation: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Count and time a control operation (``/metrics``); the outcome is ``ok`` or the
    refusal's code."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            started = time.perf_counter()
            outcome = "ok"
            try:
                return func(*args, **kwargs)
            except HoldpointError as exc:
                outcome = exc.code
                raise
            except Exception:
                outcome = "error"
                raise
            finally:
                CONTROL_LATENCY.labels(operation).observe(time.perf_counter() - started)
                CONTROL_OPERATIONS.labels(operation, outcome).inc()

        return wrapper

    return decorate


def actor_for(user: UserLike, fallback: str = "system") -> str:
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.get_username()}"
    return fallback


def session_identity(session: object) -> str:
    """The identity of a browser session (``session:oidc``, ``session:password``), or
    ``session`` when the session does not say how it was opened."""
    backend = getattr(session, "get", lambda _key: None)("_auth_user_backend")
    return SESSION_SIGN_INS.get(str(backend), SESSION)


def lock_run(run_id: str) -> Run:
    """Lock and return the run row; every change to a run and its children happens under it.

    The database's clock is read in the same statement (``row_now(run)``)."""
    run: Run | None
    if postgresql():
        found = db.fetch(
            Run,
            f"SELECT {db.columns(Run, 'r')}, statement_timestamp() "  # noqa: S608 - names from the models
            f'FROM "{Run._meta.db_table}" r WHERE r."id" = %s FOR UPDATE',
            [run_id],
        )
        run = None
        if found is not None:
            run, (run.db_now,) = found  # type: ignore[attr-defined]
    else:
        run = with_db_now(Run.objects.select_for_update(of=("self",))).filter(pk=run_id).first()
    if run is None:
        raise HoldpointError("not_found", f"There is no run {run_id!r}.", run_id=run_id)
    return run


def _update_sql(obj: Any, fields: list[str] | None) -> tuple[str, list[Any]]:
    """``UPDATE`` of ``obj``'s ``fields`` (all but the key when None) as ``save`` writes it
    (``auto_now`` included), for ``write_run``."""
    meta = obj._meta
    chosen = (
        [f for f in meta.concrete_fields if not f.primary_key]
        if fields is None
        else [meta.get_field(name) for name in fields]
    )
    sets, params = [], []
    for field in chosen:
        value = field.pre_save(obj, False)
        sets.append(f'"{field.column}" = %s')
        params.append(field.get_db_prep_save(value, connection))
    params.append(obj.pk)
    table, key = meta.db_table, meta.pk.column
    return f'UPDATE "{table}" SET {", ".join(sets)} WHERE "{key}" = %s', params  # noqa: S608 - names from the models


def _insert_sql(objs: list[Any]) -> tuple[str, list[Any]]:
    """One multi-row ``INSERT`` of ``objs`` (one model), as ``create`` writes each (defaults and
    ``auto_now_add`` included; a database-generated key is left to the database)."""
    meta = objs[0]._meta
    fields = [f for f in meta.concrete_fields if not (f.primary_key and f.db_returning)]
    values, params = [], []
    for obj in objs:
        values.append("(" + ", ".join(["%s"] * len(fields)) + ")")
        params += [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    columns = ", ".join(f'"{f.column}"' for f in fields)
    return f'INSERT INTO "{meta.db_table}" ({columns}) VALUES {", ".join(values)}', params  # noqa: S608 - names from the models


def write_run(
    run: Run,
    *,
    fields: list[str] | None = None,
    attempt: Attempt | None = None,
    attempt_fields: list[str] | None = None,
    notify: tuple[str, str] | None = None,
    inserts: list[Any] | None = None,
    updates: list[Any] | None = None,
    new: bool = False,
) -> None:
    """Write what a service changed under the run lock in one statement: the events kept by
    ``batched_events(run)`` (one multi-row INSERT), the attempt, the run (``fields``: as
    ``save(update_fields=…)``, all when None), and a ``NOTIFY`` (channel, payload) that
    PostgreSQL delivers at commit. ``inserts``: new rows of one model (a checkpoint) written
    in the same statement (foreign keys are checked at commit); ``updates``: other rows
    the service changed (a request answered), written whole as ``save()`` writes them.
    Data-modifying CTEs always run, each on its own table. Other databases (SQLite, the
    single-process mode) get the same rows statement by statement. ``new``: the run itself
    is inserted (``run_start``)."""
    events = take_events(run)
    if not postgresql():
        if new:
            run.save(force_insert=True)
        for obj in inserts or []:
            obj.save(force_insert=True)
        for obj in updates or []:
            obj.save()
        if events:
            RunEvent.objects.bulk_create(events)
        if attempt is not None:
            attempt.save(update_fields=attempt_fields)
        if not new:
            run.save(update_fields=fields)
        elif notify is not None:
            notify_work(run.agent)
        return
    ctes: list[str] = []
    params: list[Any] = []
    if new:
        sql, values = _insert_sql([run])
        ctes.append(f"r AS ({sql})")
        params += values
    if inserts:
        sql, values = _insert_sql(inserts)
        ctes.append(f"i AS ({sql})")
        params += values
    if events:
        sql, values = _insert_sql(events)
        ctes.append(f"e AS ({sql})")
        params += values
    if attempt is not None:
        sql, values = _update_sql(attempt, attempt_fields)
        ctes.append(f"a AS ({sql})")
        params += values
    for index, obj in enumerate(updates or []):
        sql, values = _update_sql(obj, None)
        ctes.append(f"u{index} AS ({sql})")
        params += values
    if new:
        # Rows inserted by a CTE are not visible to the statement itself: nothing to update.
        sql = "SELECT pg_notify(%s, %s)" if notify is not None else "SELECT 1"
        params += list(notify or ())
    else:
        sql, values = _update_sql(run, fields)
        params += values
        if notify is not None:
            sql += " RETURNING pg_notify(%s, %s)"
            params += list(notify)
    if ctes:
        sql = "WITH " + ", ".join(ctes) + " " + sql
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    for obj in [*events, *(inserts or []), *([run] if new else [])]:
        obj._state.adding = False
        obj._state.db = connection.alias


@dataclass(frozen=True)
class Fenced:
    run: Run
    attempt: Attempt
    now: Any  # the database clock, read in the statement that took the run lock
    # The number the run's next checkpoint takes (asked for with next_checkpoint_number).
    checkpoint_number: int | None = None


def lock_for_worker_write(
    *,
    attempt_id: str,
    lease_epoch: int,
    cancel_epoch: int | None,
    worker_token_id: int | None = None,
    next_checkpoint_number: bool = False,
) -> Fenced:
    """Lock the run of ``attempt_id`` and apply the fence (docs/architecture.md, where each rule lives).

    ``worker_token_id`` is the worker API's token (None for the in-process worker, which
    holds no token): an attempt claimed over the API takes writes from the token that
    claimed it only; any other token is refused ``not_your_lease`` before the epochs are
    even compared, so it learns nothing about the run.

    ``cancel_epoch`` is checked before ``lease_epoch``: a worker whose run was
    cancelled learns that, rather than the less useful "someone else has it".
    ``cancel_epoch=None`` fences by lease only (heartbeat, release).

    One statement finds the run through the attempt (an attempt never changes run),
    locks it and reads the clock; the attempt is read after the lock is held, so it is
    the version the lock holder before us left behind (on PostgreSQL in the same round
    trip). ``next_checkpoint_number`` also reads the number the run's next checkpoint
    takes, under the lock.
    """
    run: Run | None
    attempt: Attempt | None
    checkpoint_number: int | None = None
    if postgresql():
        # One round trip: the lock (with the clock and the agent's gate), then the attempt
        # and, for a checkpoint, the run's next checkpoint number, both read with the lock
        # held (a joined row in the locking statement could be the version from before the
        # lock's previous holder committed).
        sql = (
            f"SELECT {db.columns(Run, 'r')}, statement_timestamp(), "  # noqa: S608 - names from the models
            f'EXISTS (SELECT 1 FROM "{AgentGate._meta.db_table}" g '
            'WHERE g."agent" = r."agent" AND g."paused") '
            f'FROM "{Run._meta.db_table}" r JOIN "{Attempt._meta.db_table}" a '
            'ON a."run_id" = r."id" WHERE a."id" = %s FOR UPDATE OF r; '
            f"{db.row_sql(Attempt)}"
        )
        params = [attempt_id, attempt_id]
        if next_checkpoint_number:
            sql += (
                '; SELECT coalesce(max(c."number"), 0) + 1 '  # noqa: S608 - names from the models
                f'FROM "{Checkpoint._meta.db_table}" c JOIN "{Attempt._meta.db_table}" a '
                'ON c."run_id" = a."run_id" WHERE a."id" = %s'
            )
            params.append(attempt_id)
        rows = db.fetch_rows(sql, params)
        run = attempt = None
        if rows[0] is not None and rows[1] is not None:
            run = db.build(Run, rows[0])
            # The agent's gate as the statement found it: whether to stop at a boundary.
            run.db_now, run.gate_closed_at_lock = rows[0][db.width(Run) :]  # type: ignore[attr-defined]
            attempt = db.build(Attempt, rows[1])
            if next_checkpoint_number:
                checkpoint_number = rows[2][0]  # type: ignore[index]
    else:
        run = (
            with_db_now(Run.objects.select_for_update(of=("self",)))
            .filter(attempts__pk=attempt_id)
            .first()
        )
        attempt = None if run is None else db.get(Attempt, attempt_id)
        if run is not None and next_checkpoint_number:
            checkpoint_number = (
                run.checkpoints.order_by("-number").values_list("number", flat=True).first() or 0
            ) + 1
    if run is None or attempt is None:
        raise HoldpointError("not_found", f"There is no attempt {attempt_id!r}.")
    now = row_now(run)
    if worker_token_id is not None and attempt.worker_token_id != worker_token_id:
        STALE_WRITES.labels("not_your_lease").inc()
        raise HoldpointError(
            "not_your_lease",
            "This attempt was claimed with another worker token; the write was not applied.",
            attempt_id=attempt_id,
        )
    if cancel_epoch is not None and run.cancel_epoch != cancel_epoch:
        STALE_WRITES.labels("stale_after_cancel").inc()
        raise HoldpointError(
            "stale_after_cancel",
            "The run was cancelled after this worker claimed it; the write was not applied.",
            run_cancel_epoch=run.cancel_epoch,
            given_cancel_epoch=cancel_epoch,
        )
    if run.lease_epoch != lease_epoch or attempt.lease_epoch != lease_epoch:
        STALE_WRITES.labels("stale_worker").inc()
        raise HoldpointError(
            "stale_worker",
            "Another lease was granted after this one; the write was not applied.",
            run_lease_epoch=run.lease_epoch,
            given_lease_epoch=lease_epoch,
        )
    if attempt.status != AttemptStatus.RUNNING or run.current_attempt_id != attempt.id:
        STALE_WRITES.labels("stale_worker").inc()
        raise HoldpointError(
            "stale_worker",
            f"The attempt is {attempt.status}; it no longer holds a lease.",
            attempt_status=attempt.status,
        )
    if attempt.lease_expires_at is not None and lease_ran_out(attempt.lease_expires_at, now):
        STALE_WRITES.labels("lease_expired").inc()
        raise HoldpointError(
            "stale_worker",
            "The lease ran out before this write; another worker may take the attempt.",
            lease_expires_at=attempt.lease_expires_at.isoformat(),
        )
    return Fenced(run=run, attempt=attempt, now=now, checkpoint_number=checkpoint_number)


@dataclass(frozen=True)
class Renewed:
    """What a renewal read under the run lock: the new expiry and the run's signals."""

    lease_expires_at: dt.datetime
    renewed_at: dt.datetime  # the database's clock in the renewing statement
    run_status: str
    run_cancel_epoch: int
    attempt_cancel_epoch: int
    gate_closed: bool


_RENEW_SQL: str | None = None


def _renew_sql() -> str:
    run, attempt, gate = Run._meta.db_table, Attempt._meta.db_table, AgentGate._meta.db_table
    # The CTE takes the run's row lock as lock_for_worker_write's statement does (FOR UPDATE
    # OF the run, found through the attempt), so a renewal is ordered with every change of
    # the run exactly as before. Under READ COMMITTED the UPDATE then re-reads the attempt
    # row if a writer changed it meanwhile, so both rows are judged as they now are.
    return (
        f'WITH locked AS (SELECT r."id", r."status", r."cancel_epoch", '  # noqa: S608 - names from the models
        'r."lease_epoch", r."current_attempt_id", statement_timestamp() AS now, '
        f'EXISTS (SELECT 1 FROM "{gate}" g WHERE g."agent" = r."agent" AND g."paused") '
        f'AS gate_closed FROM "{run}" r JOIN "{attempt}" a ON a."run_id" = r."id" '
        'WHERE a."id" = %s FOR UPDATE OF r) '
        f'UPDATE "{attempt}" a SET "lease_expires_at" = locked.now + '
        'make_interval(secs => %s), "last_heartbeat_at" = locked.now FROM locked '
        'WHERE a."id" = %s AND a."run_id" = locked."id" '
        # The fence of lock_for_worker_write with cancel_epoch=None, in its order: the
        # token, the lease epoch (run and attempt), a running current attempt, a live lease.
        'AND (%s::bigint IS NULL OR a."worker_token_id" = %s::bigint) '
        'AND locked."lease_epoch" = %s AND a."lease_epoch" = %s '
        'AND a."status" = %s AND locked."current_attempt_id" = a."id" '
        # lease_ran_out (runs/leases.py): no expiry, or an expiry at or before now.
        'AND a."lease_expires_at" IS NOT NULL AND a."lease_expires_at" > locked.now '
        'RETURNING a."lease_expires_at", locked.now, locked."status", locked."cancel_epoch", '
        'a."cancel_epoch", locked.gate_closed'
    )


def renew_lease(
    *, attempt_id: str, lease_epoch: int, seconds: float, worker_token_id: int | None
) -> Renewed | None:
    """Renew a lease in one statement (PostgreSQL): the run lock, the fence of
    ``lock_for_worker_write`` with ``cancel_epoch=None`` and the new expiry, all in the
    one ``UPDATE … RETURNING``. Return None when the fence refuses (or on SQLite): the
    caller then goes through ``lock_for_worker_write``, which says exactly why (the one
    place the refusal's code, words and metrics come from). A refusal changes nothing.

    Same fence, same lock, one round trip instead of four: renewals are most of the
    worker calls (``bench/capacity.py``). ``tests/runs/test_renew_lease.py`` holds the two
    to the same verdicts."""
    global _RENEW_SQL
    if not postgresql():
        return None
    if _RENEW_SQL is None:
        _RENEW_SQL = _renew_sql()
    with connection.cursor() as cursor:
        cursor.execute(
            _RENEW_SQL,
            [
                attempt_id,
                seconds,
                attempt_id,
                worker_token_id,
                worker_token_id,
                lease_epoch,
                lease_epoch,
                AttemptStatus.RUNNING,
            ],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    return Renewed(
        lease_expires_at=row[0],
        renewed_at=row[1],
        run_status=row[2],
        run_cancel_epoch=row[3],
        attempt_cancel_epoch=row[4],
        gate_closed=bool(row[5]),
    )


# Attempts that run the same step again from the same checkpoint after the one before
# them ended early: they carry its answer on. A person's retry plans afresh.
_CARRY_THE_ANSWER = frozenset(
    {
        AttemptReason.LEASE_EXPIRED,
        AttemptReason.RELEASED,
        AttemptReason.AUTO_RETRY,
        AttemptReason.HELD,
    }
)


def queue_attempt(
    run: Run,
    *,
    reason: str,
    resume_from: Checkpoint | None,
    not_before: Any,
    resume_request: InputRequest | None = None,
    written_later: bool = False,
    number: int | None = None,
) -> Attempt:
    """Create the run's next attempt, queued; the caller sets the run's status and saves it.

    ``written_later``: the attempt is made but not saved, and no worker is woken; the
    caller passes it to ``write_run(inserts=[attempt], notify=work_notice(run.agent))``,
    which writes both with the run in one statement."""
    if number is None:  # a new run's first attempt is number 1 without asking
        if postgresql():
            # No queryset to build (docs/performance.md); an aggregate always has its row.
            (latest,) = db.fetch_rows(  # type: ignore[misc]
                'SELECT max("number") FROM runs_attempt WHERE run_id = %s', [run.pk]
            )[0]
        else:
            latest = run.attempts.order_by("-number").values_list("number", flat=True).first()
        number = (latest or 0) + 1
    if (
        resume_request is None
        and reason in _CARRY_THE_ANSWER
        and resume_from is not None
        and run.current_attempt_id
    ):
        # An attempt resumed with an answer that ended before its step moved past the
        # checkpoint (a lost worker, a transient failure) hands the answer on: the step runs
        # again from the same state and must still use what people approved, or stop and
        # say so (runtime/questions.py), never go on as if nobody had been asked.
        previous = (
            Attempt.objects.filter(pk=run.current_attempt_id)
            .values_list("resume_request_id", "resume_from_id")
            .first()
        )
        if previous and previous[0] and previous[1] == resume_from.pk:
            resume_request = InputRequest(pk=previous[0])
    attempt = Attempt(
        run=run,
        number=number,
        status=AttemptStatus.QUEUED,
        reason=reason,
        resume_from=resume_from,
        resume_request=resume_request,
    )
    if not written_later:
        attempt.save(force_insert=True)
        notify_work(run.agent)
    run.current_attempt = attempt
    run.not_before = not_before
    return attempt


def close_request(
    run: Run, request_id: str, *, status: str, reason: str, now: Any, actor: str
) -> None:
    """Close a pending question of ``run`` (locked by the caller) without an answer, saying
    why ("Closed: run cancelled"), with its ``request.closed`` event. The one way a question
    closes unanswered: the inbox and the timeline then tell the same story."""
    InputRequest.objects.filter(pk=request_id, status=RequestStatus.PENDING).update(
        status=status, closed_reason=reason, closed_at=now
    )
    append_event(
        run,
        EventType.REQUEST_CLOSED,
        actor,
        {"request_id": request_id, "status": status, "reason": reason},
    )


def close_pending_request(run: Run, *, status: str, reason: str, now: Any, actor: str) -> None:
    """Close the run's open question without an answer (``close_request``)."""
    if run.pending_request_id is None:
        return
    close_request(run, run.pending_request_id, status=status, reason=reason, now=now, actor=actor)
    run.pending_request = None


def lease_seconds_or_default(value: float | None) -> float:
    if value is None:
        return float(settings.HOLDPOINT_LEASE_SECONDS)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise HoldpointError("invalid_input", "lease_seconds must be a number.") from None
    if not 0.1 <= seconds <= 3600:
        raise HoldpointError("invalid_input", "lease_seconds must be between 0.1 and 3600.")
    return seconds


def parse_cost(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        cost = Decimal(str(value))
    except InvalidOperation:
        raise HoldpointError("invalid_input", "cost must be a number.") from None
    if not cost.is_finite() or cost < 0 or cost > Decimal("1e8"):
        raise HoldpointError("invalid_input", "cost must be a non-negative number below 1e8.")
    return cost.quantize(Decimal("0.000001"))


def set_attempt_cost(run: Run, attempt: Attempt, cost: Decimal | None) -> bool:
    """Record the attempt's total cost so far; the run's cost is the sum over its attempts.

    Return whether anything changed (so a caller can leave the cost columns alone)."""
    if cost is None or cost == attempt.cost:
        return False
    run.cost = run.cost - attempt.cost + cost
    attempt.cost = cost
    return True


# No trailing \b: numbers glued to a unit ("after 30s", "503ms") vary between occurrences too.
_NUMBER = re.compile(r"\b\d+(\.\d+)?")
_HEX = re.compile(r"\b(0x)?[0-9a-f]{8,}\b")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_PUBLIC_ID = re.compile(r"\b(run|att|cp|req|op)_[0-9A-Za-z]{26}\b")
_SPACE = re.compile(r"\s+")


def normalise_message(message: str) -> str:
    """Drop what varies between occurrences of the same error: ids, numbers, addresses."""
    text = message.strip().lower()
    text = _PUBLIC_ID.sub("<id>", text)
    text = _UUID.sub("<uuid>", text)
    text = _HEX.sub("<hex>", text)
    text = _NUMBER.sub("<n>", text)
    return _SPACE.sub(" ", text)[:500]


def error_fingerprint(*, error_type: str, message: str, step: str) -> str:
    raw = f"{error_type}\x00{normalise_message(message)}\x00{step}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


# A pause has no expiry unless one is given; the column is not nullable, so "never" is far.
PAUSE_NO_EXPIRY = dt.timedelta(days=36500)
# A pause takes no value: continuing is the answer.
PAUSE_SCHEMA: dict[str, Any] = {"type": "null"}


def gate_closed(agent: str) -> bool:
    """Whether ``agent``'s gate is closed (the kill switch): its attempts stop at a boundary."""
    return AgentGate.objects.filter(agent=agent, paused=True).exists()


def run_gate_closed(run: Run) -> bool:
    """``gate_closed(run.agent)``, as the fence's locking statement read it when it did (a
    heartbeat or the next boundary sees a later change), else read now."""
    closed = getattr(run, "gate_closed_at_lock", None)
    return gate_closed(run.agent) if closed is None else bool(closed)


def clear_pause_request(run: Run) -> None:
    run.pause_reason = ""
    run.pause_actor = ""
    run.pause_requested_at = None
    run.pause_expires_in = None


def pause_locked(
    run: Run,
    *,
    attempt: Attempt,
    transition: str,
    now: Any,
    actor: str,
    reason: str,
    paused_by: str,
    requested_at: Any = None,
    breakpoint: str | None = None,
    expires_in: float | None = None,
) -> InputRequest:
    """Under the run lock: the run stops at its latest checkpoint and holds a request of
    kind ``pause`` on it (who paused, why, since when). Continuing is a resume of that
    request on that checkpoint, the same compare-and-set as every answer.

    The caller has ended ``attempt`` (or it is the aborted queued one); this sets the
    run's status through ``transition`` and appends ``run.paused``. A run that never
    reached a checkpoint pauses on none: continuing then names ``checkpoint_id: null``.
    """
    checkpoint = run.latest_checkpoint
    deadline = now + (dt.timedelta(seconds=expires_in) if expires_in else PAUSE_NO_EXPIRY)
    context: dict[str, Any] = {
        "paused_by": paused_by,
        "requested_at": (requested_at or now).isoformat(),
        "paused_at": now.isoformat(),
        "step": checkpoint.step if checkpoint is not None else None,
        "breakpoint": breakpoint,
        "expires": bool(expires_in),
    }
    request = InputRequest.objects.create(
        run=run,
        attempt=attempt,
        checkpoint=checkpoint,
        kind=RequestKind.PAUSE,
        step_id="",
        reason=reason,
        prompt=reason,
        accepted_schema=PAUSE_SCHEMA,
        context=context,
        expires_at=deadline,
    )
    run.status = next_status(run.status, transition)
    run.pending_request = request
    run.not_before = None
    clear_pause_request(run)
    append_event(
        run,
        EventType.RUN_PAUSED,
        actor,
        {
            "request_id": request.id,
            "checkpoint_id": checkpoint.id if checkpoint is not None else None,
            "step": context["step"],
            "breakpoint": breakpoint,
            "reason": reason,
            "paused_by": paused_by,
        },
    )
    return request


def pause_as_requested(run: Run, attempt: Attempt, *, now: Any, actor: str) -> InputRequest:
    """A ``pause_requested`` run reached its step boundary: it pauses as it was asked to
    (by whom, why, since when, for how long: what ``run_pause`` recorded on the run)."""
    return pause_locked(
        run,
        attempt=attempt,
        transition="pause_done",
        now=now,
        actor=actor,
        reason=run.pause_reason,
        paused_by=run.pause_actor,
        requested_at=run.pause_requested_at,
        expires_in=run.pause_expires_in,
    )
