# The operations page (runs/stats.py): its hourly rollups, kept by the sweep, and the three
# partial indexes on the big tables that the rollup and the page read through.

from decimal import Decimal

from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class AddIndexWithoutBlockingWrites(AddIndexConcurrently):
    """``CREATE INDEX CONCURRENTLY`` on PostgreSQL (as 0017_audit_index): runs, attempts and
    requests are written by every run operation, so a plain ``CREATE INDEX`` would hold
    those writes for as long as the build takes. Elsewhere (SQLite) a plain index."""

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


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("runs", "0019_agent_event"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="FailureHour",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("hour", models.DateTimeField()),
                ("agent", models.CharField(max_length=100)),
                ("error_class", models.CharField(max_length=30)),
                ("fingerprint", models.CharField(blank=True, max_length=64)),
                ("error_type", models.CharField(blank=True, max_length=200)),
                ("message", models.CharField(blank=True, max_length=200)),
                ("attempts", models.PositiveIntegerField()),
            ],
        ),
        migrations.CreateModel(
            name="RunHour",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("hour", models.DateTimeField()),
                ("agent", models.CharField(max_length=100)),
                ("status", models.CharField(max_length=20)),
                ("failure_class", models.CharField(blank=True, max_length=30)),
                ("runs", models.PositiveIntegerField()),
                (
                    "cost",
                    models.DecimalField(decimal_places=6, default=Decimal("0"), max_digits=20),
                ),
            ],
        ),
        migrations.CreateModel(
            name="StatsRollup",
            fields=[
                ("name", models.CharField(max_length=40, primary_key=True, serialize=False)),
                ("rolled_at", models.DateTimeField()),
            ],
        ),
        AddIndexWithoutBlockingWrites(
            model_name="attempt",
            index=models.Index(
                condition=models.Q(("error_class", ""), _negated=True),
                fields=["ended_at"],
                name="attempt_error_ended_idx",
            ),
        ),
        AddIndexWithoutBlockingWrites(
            model_name="inputrequest",
            index=models.Index(
                condition=models.Q(("status", "expired")),
                fields=["closed_at"],
                name="request_expired_closed_idx",
            ),
        ),
        AddIndexWithoutBlockingWrites(
            model_name="run",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False)),
                fields=["finished_at"],
                name="run_finished_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="failurehour",
            index=models.Index(fields=["hour"], name="failurehour_hour_idx"),
        ),
        migrations.AddIndex(
            model_name="runhour",
            index=models.Index(fields=["hour"], name="runhour_hour_idx"),
        ),
    ]
