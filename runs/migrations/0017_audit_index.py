# The audit trail (GET /api/audit): the permission to export it, given to the admin group,
# and the two partial indexes that serve it (runs/audit_log.py).

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from runs.groups import ensure_default_groups

# The event types of the audit trail when this migration was written (runs/audit.py,
# AUDIT_EVENT_TYPES), frozen here as a migration must be.
AUDIT_EVENT_TYPES = (
    "run.created",
    "run.approved_at_start",
    "request.answered",
    "approval.given",
    "approval.objected",
    "approval.changed",
    "run.continued",
    "run.cancel_requested",
    "run.retried",
    "run.pause_requested",
    "agent.paused",
    "agent.unpaused",
)


class AddIndexWithoutBlockingWrites(AddIndexConcurrently):
    """``CREATE INDEX CONCURRENTLY`` on PostgreSQL: the events table is the largest one and
    every run operation appends to it, so a plain ``CREATE INDEX`` would hold every run's
    writes for as long as the build takes. Elsewhere (SQLite, one process) a plain index."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_forwards(
                self, app_label, schema_editor, from_state, to_state
            )

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)
        else:
            migrations.AddIndex.database_backwards(
                self, app_label, schema_editor, from_state, to_state
            )


def grant_view_audit(apps, schema_editor):
    """Admins may export the audit trail (runs.view_audit), as the groups say."""
    from django.contrib.auth.management import create_permissions

    # Permissions are normally created after all migrations; make sure ours exist now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0)
        app_config.models_module = None
    ensure_default_groups(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"))


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("runs", "0016_slack"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="runevent",
            options={
                "ordering": ["run", "seq"],
                "permissions": [("view_audit", "Can export the audit trail")],
            },
        ),
        AddIndexWithoutBlockingWrites(
            model_name="runevent",
            index=models.Index(
                condition=models.Q(("type__in", AUDIT_EVENT_TYPES)),
                fields=["-created_at", "-id"],
                name="event_audit_idx",
            ),
        ),
        AddIndexWithoutBlockingWrites(
            model_name="runevent",
            index=models.Index(
                condition=models.Q(("type__in", AUDIT_EVENT_TYPES)),
                fields=["actor", "-created_at", "-id"],
                name="event_audit_actor_idx",
            ),
        ),
        migrations.RunPython(grant_view_audit, migrations.RunPython.noop, atomic=True),
    ]
