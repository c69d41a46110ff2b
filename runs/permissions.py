"""A person's permission set in one query, held on the user object for the request.

Django's ``ModelBackend`` reads a user's permissions in two queries (their own, then
their groups'), once per user object. Every request loads its user afresh (a session,
a DRF token), so that was two queries per request before the view did anything
(docs/performance.md). Here both are one statement, and the result is kept where
``ModelBackend`` keeps its own (``user._perm_cache``), so ``has_perm`` asks nothing more
for the rest of the request. Nothing is cached across requests: a permission or group
change counts from the next request on, as before.

``PERMISSIONS_OF_USER`` is the same statement as a correlated subquery, for a query that
loads the user (the token lookup of ``api.authentication`` loads token, user and
permissions in one statement on PostgreSQL).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection

from runs.db import postgresql


def _tables() -> dict[str, str]:
    return {
        "perm": Permission._meta.db_table,
        "ct": ContentType._meta.db_table,
        "user_perms": User.user_permissions.through._meta.db_table,
        "group_perms": Group.permissions.through._meta.db_table,
        "user_groups": User.groups.through._meta.db_table,
    }


def _ids_sql(user_id_sql: str) -> str:
    """The permission ids of a user: their own and their groups', in one subquery."""
    t = _tables()
    return (
        f'SELECT "permission_id" FROM "{t["user_perms"]}" WHERE "user_id" = {user_id_sql} '  # noqa: S608 - names from the models; values are parameters
        f'UNION SELECT gp."permission_id" FROM "{t["group_perms"]}" gp '
        f'JOIN "{t["user_groups"]}" ug ON ug."group_id" = gp."group_id" '
        f'WHERE ug."user_id" = {user_id_sql}'
    )


def permissions_of_user_sql(user_id_sql: str) -> str:
    """``app_label.codename`` of each permission of the user ``user_id_sql`` names (a column
    of the outer query, or a parameter placeholder), one per row."""
    t = _tables()
    return (
        f'SELECT ct."app_label" || \'.\' || p."codename" FROM "{t["perm"]}" p '  # noqa: S608 - names from the models; values are parameters
        f'JOIN "{t["ct"]}" ct ON ct."id" = p."content_type_id" '
        f'WHERE p."id" IN ({_ids_sql(user_id_sql)})'
    )


def permission_set(user: Any) -> set[str]:
    """Every permission of ``user`` (own and groups'), as ``ModelBackend`` names them, in one
    query. A superuser holds every permission (as ``ModelBackend`` says)."""
    if not user.is_active or user.is_anonymous:
        return set()
    if user.is_superuser:
        return {
            f"{app}.{codename}"
            for app, codename in Permission.objects.values_list(
                "content_type__app_label", "codename"
            ).order_by()
        }
    with connection.cursor() as cursor:
        cursor.execute(permissions_of_user_sql("%s"), [user.pk, user.pk])
        return {row[0] for row in cursor.fetchall()}


def remember_permissions(user: Any, names: set[str]) -> None:
    """Keep ``names`` as ``user``'s permission set for this object's life (the request), where
    ``ModelBackend`` keeps its own. Not for a superuser (ModelBackend gives them all)."""
    if not user.is_superuser:
        user._perm_cache = names


def user_select_sql(alias: str) -> tuple[str, list[str]]:
    """The user's columns of table alias ``alias`` and their permission names as a last
    column (PostgreSQL's ARRAY of the subquery), and the attribute names of the columns."""
    fields = User._meta.concrete_fields
    columns = ", ".join(f'{alias}."{f.column}"' for f in fields)
    user_id = f'{alias}."id"'
    return (
        f"{columns}, ARRAY({permissions_of_user_sql(user_id)})",
        [f.attname for f in fields],
    )


def user_from_row(values: Any, attnames: list[str]) -> Any:
    """A user from ``user_select_sql``'s columns (the permission array last), its permission
    set remembered."""
    user = User.from_db(connection.alias, attnames, values[:-1])
    remember_permissions(user, set(values[-1]))
    return user


def user_with_permissions(user_id: Any) -> Any:
    """The user ``user_id`` with their permission set, in one query on PostgreSQL; None when
    there is no such user."""
    if not postgresql():
        # Elsewhere (SQLite) two statements: the user, then the permission set in one.
        user = User._default_manager.filter(pk=user_id).first()
        if user is not None and not user.is_superuser:
            remember_permissions(user, permission_set(user))
        return user
    select, attnames = user_select_sql("u")
    sql = f'SELECT {select} FROM "{User._meta.db_table}" u WHERE u."id" = %s'  # noqa: S608 - names from the models
    with connection.cursor() as cursor:
        cursor.execute(sql, [user_id])
        row = cursor.fetchone()
    return None if row is None else user_from_row(row, attnames)
