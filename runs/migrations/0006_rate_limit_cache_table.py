"""The cache table of rate limits and the sign-in lockout (settings: HOLDPOINT_CACHE=database,
the default with DATABASE_URL and no REDIS_URL). Created on every database so that switching
the cache to it needs no extra step; the table is Django's createcachetable layout."""

from __future__ import annotations

from typing import Any

from django.core.management.commands.createcachetable import Command as CreateCacheTable
from django.db import migrations

TABLE = "holdpoint_cache"


def create_table(apps: Any, schema_editor: Any) -> None:
    command = CreateCacheTable()
    command.verbosity = 0
    command.create_table(schema_editor.connection.alias, TABLE, dry_run=False)


def drop_table(apps: Any, schema_editor: Any) -> None:
    quoted = schema_editor.connection.ops.quote_name(TABLE)
    schema_editor.execute(f"DROP TABLE IF EXISTS {quoted}")


class Migration(migrations.Migration):
    dependencies = [("runs", "0005_inputrequest_pending_kind_idx")]

    operations = [migrations.RunPython(create_table, drop_table)]
