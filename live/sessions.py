"""Who each socket's session stands for now, and what each may do: a few queries for all
the sockets of a push (the same checks as ``django.contrib.auth.get_user``)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.contrib.sessions.backends.db import SessionStore as DatabaseSessionStore
from django.contrib.sessions.models import Session
from django.db import connection
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from django.utils.module_loading import import_string

from live.roles import Person, Role
from runs import db

DATABASE_SESSIONS = (
    "django.contrib.sessions.backends.db",
    "django.contrib.sessions.backends.cached_db",
)


def signed_in_users(scopes: Iterable[dict[str, Any]]) -> dict[str, Person | None]:
    """Who each socket's session stands for now, or None; and what each may do. Three
    queries for them all, however many sockets (sessions, users, permissions).

    The same checks as ``django.contrib.auth.get_user``: a session that ended (signed out,
    expired) or whose password changed since gives no user, nor does an inactive one.
    Permissions are read afresh (``permissions_of``). Every push reads the rows again; what
    is computed from a row's text alone (a session's claim, a password's session hash) is
    kept per process, keyed by that text, so a changed row is a new key.
    """
    keys = {session_key(scope) for scope in scopes} - {""}
    claims: dict[str, tuple[str, str]] = {}
    for key, claim in _session_claims(keys):
        if claim is not None:
            claims[key] = claim
    user_model = get_user_model()
    user_ids = {user_id for user_id, _hash in claims.values()}
    users = {str(u.pk): u for u in user_model._default_manager.filter(pk__in=user_ids)}
    result: dict[str, Person | None] = dict.fromkeys(keys)
    signed_in: dict[str, Any] = {}
    for key, (user_id, session_hash) in claims.items():
        user = users.get(user_id)
        if user is None or not user.is_active:
            continue
        if not constant_time_compare(session_hash, _session_auth_hash(user)):
            continue
        signed_in[key] = user
    roles = permissions_of(list({id(u): u for u in signed_in.values()}.values()))
    for key, user in signed_in.items():
        result[key] = Person(user.pk, roles[id(user)])
    return result


def _model_backend_permissions() -> bool:
    """Whether every authentication backend answers permissions as ModelBackend does (each
    may be a subclass that changes only how people sign in, like the lockout's and the
    company sign-in's): then their union, which Django answers, is ModelBackend's answer."""
    backends = [import_string(path) for path in settings.AUTHENTICATION_BACKENDS]
    return bool(backends) and all(
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
        for backend in backends
    )


def permissions_of(users: list[Any]) -> dict[int, Role]:
    """Each (active) user's role, by ``id(user)``: one query for them all (their own
    permissions, their groups, those groups' permissions: ``_permission_rows``).

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
    memberships: list[tuple[str, Any]] = []
    of_group: dict[Any, set[str]] = {}
    for kind, user_pk, group_pk, name in _permission_rows([u.pk for u in ordinary.values()]):
        if kind == "user":
            found[str(user_pk)].add(name)
        elif kind == "member":
            memberships.append((str(user_pk), group_pk))
        else:
            of_group.setdefault(group_pk, set()).add(name)
    for user_key, group_pk in memberships:
        found[user_key] |= of_group.get(group_pk, set())
    for key, user in ordinary.items():
        roles[id(user)] = Role(frozenset(found[key]))
    for user in users:
        if user.is_superuser:
            roles[id(user)] = Role(frozenset(), superuser=True)
    return roles


def _permission_rows(pks: list[Any]) -> list[tuple[str, Any, Any, str]]:
    """(kind, user, group, "app_label.codename") for the users ``pks``, in one statement:
    each user's own permissions ("user"), each membership ("member", name ""), and each of
    those groups' permissions once ("group"), not once per member: a hundred people in
    three groups are a hundred memberships and the three groups' permissions."""
    if not pks:
        return []
    user_model = get_user_model()
    qn = connection.ops.quote_name

    def names(model: Any, *fields: str) -> dict[str, str]:
        meta = model._meta
        return {"table": qn(meta.db_table)} | {f: qn(meta.get_field(f).column) for f in fields}

    own = names(user_model.user_permissions.through, "user", "permission")
    member = names(user_model.groups.through, "user", "group")
    granted = names(Group.permissions.through, "group", "permission")
    perm = names(Permission, "id", "content_type", "codename")
    ctype = names(ContentType, "id", "app_label")
    if db.postgresql():
        among, params = "= ANY(%s)", [list(pks)] * 3
    else:
        among, params = f"IN ({', '.join(['%s'] * len(pks))})", list(pks) * 3

    def named(rows: dict[str, str]) -> str:
        """The permission of ``x``'s rows, as (app_label, codename)."""
        return (
            f"JOIN {perm['table']} p ON p.{perm['id']} = x.{rows['permission']} "
            f"JOIN {ctype['table']} ct ON ct.{ctype['id']} = p.{perm['content_type']}"
        )

    # Names from the models, quoted; the users' ids are parameters.
    sql = (
        f"SELECT 'user', x.{own['user']}, NULL, ct.{ctype['app_label']}, p.{perm['codename']} "  # noqa: S608 - names from the models
        f"FROM {own['table']} x {named(own)} WHERE x.{own['user']} {among} "
        f"UNION ALL SELECT 'member', m.{member['user']}, m.{member['group']}, NULL, NULL "
        f"FROM {member['table']} m WHERE m.{member['user']} {among} "
        f"UNION ALL SELECT 'group', NULL, x.{granted['group']}, ct.{ctype['app_label']}, "
        f"p.{perm['codename']} FROM {granted['table']} x {named(granted)} "
        f"WHERE x.{granted['group']} IN (SELECT m.{member['group']} FROM {member['table']} m "
        f"WHERE m.{member['user']} {among})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [
            (kind, user_pk, group_pk, f"{app_label}.{codename}" if codename else "")
            for kind, user_pk, group_pk, app_label, codename in cursor.fetchall()
        ]


def _session_claims(keys: set[str]) -> Iterable[tuple[str, tuple[str, str] | None]]:
    """Each session that still exists, with its claim (``_claim``): one query with database
    sessions, which reads the rows' text only (no model objects)."""
    if settings.SESSION_ENGINE in DATABASE_SESSIONS:
        rows = Session.objects.filter(
            session_key__in=keys, expire_date__gt=timezone.now()
        ).values_list("session_key", "session_data")
        return [(key, _claim(data, settings.SECRET_KEY)) for key, data in rows]
    engine = import_module(settings.SESSION_ENGINE)
    return [(key, _claim_of(engine.SessionStore(key).load())) for key in keys]


@functools.lru_cache(maxsize=4096)
def _claim(session_data: str, _secret: str) -> tuple[str, str] | None:
    """Who a database session's text says it stands for: (user id, session hash), or None.

    A pure function of the text and the secret (both in the key): a session saved again
    has a new text, a signed-out one no row. Decoding checks the text's signature, the bulk
    of a push's session work when done again for every socket at every push."""
    return _claim_of(DatabaseSessionStore().decode(session_data))


def _claim_of(data: dict[str, Any]) -> tuple[str, str] | None:
    if SESSION_KEY not in data:
        return None
    return (str(data[SESSION_KEY]), str(data.get(HASH_SESSION_KEY)))


@functools.lru_cache(maxsize=4096)
def _password_session_hash(pk: Any, password: str, _secret: str) -> str:
    return str(get_user_model()(pk=pk, password=password).get_session_auth_hash())


def _session_auth_hash(user: Any) -> str:
    """``user.get_session_auth_hash()``, kept per (user, password hash, secret): Django's
    ``AbstractBaseUser`` computes it from these alone. A user model that computes it
    otherwise is asked each time."""
    if type(user).get_session_auth_hash is not AbstractBaseUser.get_session_auth_hash:
        return str(user.get_session_auth_hash())
    return _password_session_hash(user.pk, user.password, settings.SECRET_KEY)


def session_key(scope: dict[str, Any]) -> str:
    return str(scope.get("cookies", {}).get(settings.SESSION_COOKIE_NAME, ""))
