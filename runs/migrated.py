"""Whether the database has every migration, so that a command run before ``migrate`` says
so in one sentence instead of failing with a traceback about a missing table."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

NOT_MIGRATED = "The database is not set up: run `python manage.py migrate` first."


def unapplied_migrations(alias: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The migrations not applied yet (``app.name``), in the order ``migrate`` applies them."""
    executor = MigrationExecutor(connections[alias])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _ in plan]


def require_migrated() -> None:
    """Raise ``CommandError`` (a message, no traceback) unless the database is migrated."""
    try:
        missing = unapplied_migrations()
    except DatabaseError as exc:
        raise CommandError(f"The database cannot be reached: {exc}".strip()) from None
    if missing:
        raise CommandError(
            f"{NOT_MIGRATED} ({len(missing)} migrations are not applied, the first is "
            f"{missing[0]}.)"
        )
