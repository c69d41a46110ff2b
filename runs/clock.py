"""The clock that lease decisions use.

Leases are compared against the database's clock, not the clock of whichever
process happens to run the service: web processes and workers on several
machines disagree by seconds, the database is one clock they all share.
SQLite is the single-process mode, where the process clock *is* the one clock.
"""

from __future__ import annotations

import datetime as dt

from django.db import connection
from django.utils import timezone


def db_now() -> dt.datetime:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            # statement_timestamp(), not now(): a long transaction must not see time stand still.
            cursor.execute("SELECT statement_timestamp()")
            (value,) = cursor.fetchone()
        return value
    return timezone.now()
