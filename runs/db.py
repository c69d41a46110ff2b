"""The run store's database: which one it is, its clock, and rows read by our own SQL.

**Which database** (``postgresql()``, ``sqlite()``): the one place the code asks.
PostgreSQL is the production store; SQLite serves the zero-setup single-process mode
(`make run`, `make test` on a fresh machine). Where the two differ, the code asks here,
never ``connection.vendor`` itself, so the forks are found in one search and each says why
it forks. What PostgreSQL gives that SQLite has not:


| where | PostgreSQL | elsewhere |
|---|---|---|
| the database's clock (``runs/db.py``) | ``statement_timestamp()`` in the statement | the process's clock |
| a service's writes (``runs/services/_base.py`` ``write_run``) | one statement (data-modifying CTEs) | statement by statement |
| waking workers (``runs/events.py``, ``runs/wakeups.py``, ``runtime/worker.py``) | ``NOTIFY`` at commit, ``LISTEN`` | in-process signals only (one process) |
| a claim (``runs/services/lifecycle.py``) | the clock in the statement, the agent's gate ``FOR SHARE`` | SQLite's write lock orders claims |
| an Idempotency-Key (``runs/idempotency.py``) | ``INSERT … ON CONFLICT`` in one round trip; the record in the service's transaction | the general path |
| rows read by raw SQL (``runs/db.py``), a person's permissions with their user or token (``runs/permissions.py``, ``api/authentication.py``), "Needs me" (``runs/selectors.py``) | one statement | the ORM, a statement more |
| one worker process per database (``runtime/devloop.py``) | any number | one (SQLite has one writer) |
| the users' ids of a push's permissions (``live/sessions.py``) | one array parameter (``= ANY(%s)``) | a placeholder per id |

**The clock** that lease decisions use (``db_now``, ``with_db_now``, ``row_now``): leases
are compared against the database's clock, not the clock of whichever process happens to
run the service: web processes and workers on several machines disagree by seconds, the
database is one clock they all share. SQLite is the single-process mode, where the process
clock *is* the one clock.

**Rows** of the hottest reads as model instances, without building an ORM query each time
(``fetch``, ``get``, ``columns``): building a queryset's SQL costs more CPU than PostgreSQL
spends answering it (``Run.objects.filter(pk=…).first()`` is ~0.6 ms of CPU against ~0.1 ms
for the same statement through a cursor, docs/performance.md). The few reads every control
operation and worker call makes (the run, its lock, the attempt, the worker token) use
these: the columns are listed once per model, values go through each field's
``from_db_value`` (JSON) and the instance is made with ``Model.from_db``, as the ORM makes
it. PostgreSQL only; callers keep the ORM path for SQLite.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from functools import cache
from typing import Any, TypeVar, cast

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Model, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

# --- Which database ----------------------------------------------------------------------


def postgresql(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether the database ``using`` is PostgreSQL (else: SQLite, the single-process mode)."""
    return connections[using].vendor == "postgresql"


def sqlite(using: str = DEFAULT_DB_ALIAS) -> bool:
    return connections[using].vendor == "sqlite"


# --- The clock ---------------------------------------------------------------------------

QS = TypeVar("QS", bound="QuerySet[Any]")


def db_now() -> dt.datetime:
    if postgresql():
        with connection.cursor() as cursor:
            # statement_timestamp(), not now(): a long transaction must not see time stand still.
            cursor.execute("SELECT statement_timestamp()")
            (value,) = cursor.fetchone()
        return value
    return timezone.now()


def with_db_now(queryset: QS) -> QS:
    """Read the database clock in the same statement as ``queryset`` (one round trip less).

    The row comes back with ``db_now`` set; read it with ``row_now``. ``Now()`` is
    ``STATEMENT_TIMESTAMP()`` on PostgreSQL, the same clock as ``db_now``.
    """
    if postgresql():
        return cast(QS, queryset.annotate(db_now=Now()))
    return queryset


def row_now(row: Any) -> dt.datetime:
    value = getattr(row, "db_now", None)
    return value if value is not None else db_now()


# --- Rows --------------------------------------------------------------------------------

M = TypeVar("M", bound=Model)


@cache
def _shape(model: type[Model]) -> tuple[list[str], list[str], list[tuple[int, Any]]]:
    fields = model._meta.concrete_fields
    converters = [
        (index, field) for index, field in enumerate(fields) if hasattr(field, "from_db_value")
    ]
    return [str(f.column) for f in fields], [f.attname for f in fields], converters


def columns(model: type[Model], alias: str) -> str:
    """``alias."col", …`` for every concrete field of ``model``, in ``build``'s order."""
    return ", ".join(f'{alias}."{column}"' for column in _shape(model)[0])


def width(model: type[Model]) -> int:
    return len(_shape(model)[0])


def build(model: type[M], values: Sequence[Any]) -> M:
    """An instance of ``model`` from the values of ``columns(model, …)``, as the ORM makes it."""
    _columns, attnames, converters = _shape(model)
    row = list(values[: len(attnames)])
    for index, field in converters:
        if row[index] is not None:
            row[index] = field.from_db_value(row[index], None, connection)
    return model.from_db(connection.alias, attnames, row)


def row_sql(model: type[Model]) -> str:
    """``SELECT <columns> FROM <table> t WHERE t.<pk> = %s``: one row by its key."""
    meta = model._meta
    return (
        f'SELECT {columns(model, "t")} FROM "{meta.db_table}" t '  # noqa: S608 - names from the models
        f'WHERE t."{meta.pk.column}" = %s'
    )


def fetch(model: type[M], sql: str, params: Sequence[Any]) -> tuple[M, tuple[Any, ...]] | None:
    """Run ``sql`` (its first columns ``columns(model, …)``); the instance and the row's
    remaining values, or None without a row."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    return build(model, row), tuple(row[width(model) :])


def fetch_rows(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...] | None]:
    """Run several ``;``-separated SELECTs in one round trip (PostgreSQL, client-side
    binding); the first row of each, or None for one that found nothing. Each statement
    starts after the one before it has finished: a statement after a ``FOR UPDATE`` reads
    with the lock held, so it sees what the lock's previous holder committed."""
    rows: list[tuple[Any, ...] | None] = []
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        while True:
            rows.append(cursor.fetchone())
            if not cursor.nextset():
                return rows


def by_pk(model: type[M], pk: Any) -> M | None:
    """``model.objects.filter(pk=pk).first()`` in one cheap statement."""
    found = fetch(model, row_sql(model), [pk])
    return None if found is None else found[0]


def get(model: type[M], pk: Any) -> M | None:
    """The row ``pk`` of ``model`` or None: ``by_pk`` on PostgreSQL, the ORM elsewhere."""
    if postgresql():
        return by_pk(model, pk)
    found: M | None = model._default_manager.filter(pk=pk).first()
    return found
