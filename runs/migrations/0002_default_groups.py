"""Default groups: viewer, operator, approver, admin, with the run permissions each holds."""

from __future__ import annotations

from django.db import migrations

from runs.groups import GROUPS, ensure_default_groups


def create_groups(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    # Permissions are normally created after all migrations; make sure ours exist now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0)
        app_config.models_module = None
    ensure_default_groups(apps.get_model("auth", "Group"), apps.get_model("auth", "Permission"))


def remove_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=GROUPS).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_groups, remove_groups)]
