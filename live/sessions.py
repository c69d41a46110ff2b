"""Who each socket's session stands for now, and what each may do: a few queries for all
the sockets of a push (the same checks as ``django.contrib.auth.get_user``)."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Permission
from django.contrib.sessions.models import Session
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from django.utils.module_loading import import_string

from live.roles import Person, Role

DATABASE_SESSIONS = (
    "django.contrib.sessions.backends.db",
    "django.contrib.sessions.backends.cached_db",
)


def signed_in_users(scopes: Iterable[dict[str, Any]]) -> dict[str, Person | None]:
    """Who each socket's session stands for now, or None; and what each may do. Five
    queries for them all, however many sockets.

    The same checks as ``django.contrib.auth.get_user``: a session that ended (signed out,
    expired) or whose password changed since gives no user, nor does an inactive one.
    Permissions are read afresh (``permissions_of``).
    """
    keys = {session_key(scope) for scope in scopes} - {""}
    claims: dict[str, tuple[str, str]] = {}
    for key, data in _sessions(keys):
        if SESSION_KEY in data:
            claims[key] = (str(data[SESSION_KEY]), str(data.get(HASH_SESSION_KEY)))
    user_model = get_user_model()
    user_ids = {user_id for user_id, _hash in claims.values()}
    users = {str(u.pk): u for u in user_model._default_manager.filter(pk__in=user_ids)}
    result: dict[str, Person | None] = dict.fromkeys(keys)
    signed_in: dict[str, Any] = {}
    for key, (user_id, session_hash) in claims.items():
        user = users.get(user_id)
        if user is None or not user.is_active:
            continue
        if not constant_time_compare(session_hash, user.get_session_auth_hash()):
            continue
        signed_in[key] = user
    roles = permissions_of(list({id(u): u for u in signed_in.values()}.values()))
    for key, user in signed_in.items():
        result[key] = Person(user.pk, roles[id(user)])
    return result


def _model_backend_permissions() -> bool:
    """Whether the one authentication backend answers permissions as ModelBackend does (it
    may be a subclass that changes only how people sign in, like the lockout's)."""
    backends = list(settings.AUTHENTICATION_BACKENDS)
    if len(backends) != 1:
        return False
    backend = import_string(backends[0])
    return (
        isinstance(backend, type)
        and issubclass(backend, ModelBackend)
        and all(
            getattr(backend, name) is getattr(ModelBackend, name)
            for name in (
                "has_perm",
                "get_all_permissions",
                "get_user_permissions",
                "get_group_permissions",
                "_get_permissions",
            )
        )
    )


def permissions_of(users: list[Any]) -> dict[int, Role]:
    """Each (active) user's role, by ``id(user)``: three queries for them all (their own
    permissions, their groups, those groups' permissions).

    The same answer as ``user.get_all_permissions()`` with Django's ``ModelBackend`` (the
    user's own permissions and their groups'; a superuser has every one). With other
    authentication backends each user is asked in turn. What renders for them asks the
    role (``runs.access.Actor``), never the user objects, so nothing is written into them.
    """
    if not _model_backend_permissions():
        return {
            id(u): Role(frozenset(u.get_all_permissions()), bool(u.is_superuser)) for u in users
        }
    roles: dict[int, Role] = {}
    ordinary = {str(u.pk): u for u in users if not u.is_superuser}
    found: dict[str, set[str]] = {pk: set() for pk in ordinary}
    own = Permission.objects.filter(user__in=list(ordinary)).values_list(
        "user", "content_type__app_label", "codename"
    )
    for user_pk, app_label, codename in own:
        found[str(user_pk)].add(f"{app_label}.{codename}")
    # Each group's permissions once, not once per member: a hundred people in three
    # groups are a hundred memberships and the three groups' permissions.
    memberships = list(
        get_user_model()
        .groups.through.objects.filter(user__in=list(ordinary))
        .values_list("user", "group")
    )
    if memberships:
        of_group: dict[Any, set[str]] = {}
        for group_pk, app_label, codename in Permission.objects.filter(
            group__in={group_pk for _user_pk, group_pk in memberships}
        ).values_list("group", "content_type__app_label", "codename"):
            of_group.setdefault(group_pk, set()).add(f"{app_label}.{codename}")
        for user_pk, group_pk in memberships:
            found[str(user_pk)] |= of_group.get(group_pk, set())
    for key, user in ordinary.items():
        roles[id(user)] = Role(frozenset(found[key]))
    for user in users:
        if user.is_superuser:
            roles[id(user)] = Role(frozenset(), superuser=True)
    return roles


def _sessions(keys: set[str]) -> Iterable[tuple[str, dict[str, Any]]]:
    """The data of the sessions that still exist: one query with database sessions."""
    if settings.SESSION_ENGINE in DATABASE_SESSIONS:
        rows = Session.objects.filter(session_key__in=keys, expire_date__gt=timezone.now())
        return [(row.session_key, row.get_decoded()) for row in rows]
    engine = import_module(settings.SESSION_ENGINE)
    return [(key, engine.SessionStore(key).load()) for key in keys]


def session_key(scope: dict[str, Any]) -> str:
    return str(scope.get("cookies", {}).get(settings.SESSION_COOKIE_NAME, ""))
