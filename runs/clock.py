"""The clock that lease decisions use.

Leases are compared against the database's clock, not the clock of whichever
process happens to run the service: web processes and workers on several
machines disagree by seconds, the database is one clock they all share.
SQLite is the single-process mode, where the process clock *is* the one clock.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, TypeVar, cast

from django.db import connection
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.utils import timezone

QS = TypeVar("QS", bound="QuerySet[Any]")


def db_now() -> dt.datetime:
    if connection.vendor == "postgresql":
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
    if connection.vendor == "postgresql":
        return cast(QS, queryset.annotate(db_now=Now()))
    return queryset


def row_now(row: Any) -> dt.datetime:
    value = getattr(row, "db_now", None)
    return value if value is not None else db_now()
