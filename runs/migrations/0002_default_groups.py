"""Default groups: viewer, operator, approver, admin, with the run permissions each holds."""

from __future__ import annotations

from django.db import migrations

GROUPS = {
    "viewer": ["view_run"],
    "operator": ["view_run", "answer_run", "start_run", "cancel_run", "retry_run"],
    "approver": ["view_run", "answer_run", "approve_run"],
    "admin": ["view_run", "answer_run", "approve_run", "start_run", "cancel_run", "retry_run"],
}


def create_groups(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    # Permissions are normally created after all migrations; make sure ours exist now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        perms = Permission.objects.filter(content_type__app_label="runs", codename__in=codenames)
        group.permissions.add(*perms)


def remove_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=GROUPS).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_groups, remove_groups)]
