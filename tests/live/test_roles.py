"""A push renders what depends on the user once per role (the set of permissions), not
once per socket, and still gives every socket its own CSRF token and idempotency keys."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from live import consumers, sessions
from live import roles as live_roles
from runs import services
from runs.groups import ensure_default_groups
from runs.models import Run
from tests.live.conftest import db, pushed, run, socket
from tests.runs.factory import claim, epochs, interrupted, start

pytestmark = pytest.mark.django_db(transaction=True)


def person(username: str, group: str) -> User:
    ensure_default_groups()
    user = User.objects.create_user(username=username, password="pw")
    user.groups.add(Group.objects.get(name=group))
    return user


def hidden(html: str, name: str) -> list[str]:
    return re.findall(rf'name="{name}" value="([^"]*)"', html)


def page_cookie(user: User, path: str) -> str:
    """The cookies of a browser that opened ``path`` signed in: its session and the CSRF
    cookie the page set."""
    client = Client()
    client.force_login(user)
    assert client.get(path).status_code == 200
    assert "csrftoken" in client.cookies
    return "; ".join(f"{name}={morsel.value}" for name, morsel in client.cookies.items())


def browser_with(cookie: str) -> Client:
    """A client holding the cookies the socket was opened with, checking CSRF as a browser
    request is checked."""
    client = Client(enforce_csrf_checks=True)
    for pair in cookie.split("; "):
        name, value = pair.split("=", 1)
        client.cookies[name] = value
    return client


def test_it_renders_the_users_part_once_per_role_and_each_role_gets_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operators = [person("olivia", "operator"), person("otto", "operator")]
    viewers = [person("victor", "viewer"), person("vera", "viewer")]
    target = start()
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="ask", state={})
    target.refresh_from_db()
    url = f"/ws/runs/{target.id}/?v={target.last_event_seq}"
    cookies = {
        user.username: page_cookie(user, f"/runs/{target.id}/") for user in operators + viewers
    }

    rendered: list[live_roles.Role] = []
    real = consumers._render_run_for

    def counting(request: Any, role: live_roles.Role, *args: Any) -> str:
        rendered.append(role)
        return real(request, role, *args)

    monkeypatch.setattr(consumers, "_render_run_for", counting)

    async def scenario() -> dict[str, str]:
        sockets = {name: socket(url, cookie=cookie) for name, cookie in cookies.items()}
        for communicator in sockets.values():
            assert (await communicator.connect())[0]
            await pushed(communicator)
        rendered.clear()
        await db(
            lambda: services.attempt_interrupt(
                **epochs(lease),
                checkpoint_id=cp.id,
                kind="input_required",
                prompt="Which versions?",
                accepted_schema={"versions": "string[]"},
                expires_in=600,
            )
        )()
        frames = {}
        for name, communicator in sockets.items():
            got = await pushed(communicator)
            assert len(got) == 1
            frames[name] = got[0]
        for communicator in sockets.values():
            await communicator.disconnect()
        return frames

    frames = run(scenario)

    # Four sockets, two roles: two renders of the user's part.
    assert sorted(role.has_perm("runs.cancel_run") for role in rendered) == [False, True]
    for html in frames.values():
        assert live_roles._MARK not in html
        assert f'id="run-{target.id}-controls"' in html
        assert "Which versions?" in html
    for user in operators:
        html = frames[user.username]
        assert f'action="/runs/{target.id}/cancel"' in html
        assert len(hidden(html, "csrfmiddlewaretoken")) == 2  # cancel, answer
        assert len(set(hidden(html, "idempotency_key"))) == 2
        assert "Only operators can cancel runs." not in html
        assert '<fieldset class="form-body" disabled>' not in html
    for user in viewers:
        html = frames[user.username]
        assert "Only operators can cancel runs." in html
        assert "/cancel" not in html
        # The card shows its form, disabled: a viewer may not answer.
        assert '<fieldset class="form-body" disabled>' in html
        assert len(hidden(html, "csrfmiddlewaretoken")) == 1
    # One render per role, and still every page has keys and a token of its own.
    for pair in (operators, viewers):
        a, b = (frames[u.username] for u in pair)
        assert not set(hidden(a, "idempotency_key")) & set(hidden(b, "idempotency_key"))
        assert not set(hidden(a, "csrfmiddlewaretoken")) & set(hidden(b, "csrfmiddlewaretoken"))

    # The pushed cancel form posts as a rendered one: with its own page's CSRF token...
    cancel, otto = f"/runs/{target.id}/cancel", frames["otto"]
    otto_form = {
        "csrfmiddlewaretoken": hidden(otto, "csrfmiddlewaretoken")[0],
        "idempotency_key": hidden(otto, "idempotency_key")[0],
        "run_id": target.id,
        "reason": "not needed",
    }
    # ...and not with another person's: Otto's token is refused with Olivia's cookie.
    refused = browser_with(cookies["olivia"]).post(cancel, otto_form)
    assert refused.status_code == 403
    assert Run.objects.get(pk=target.id).status == "input_required"
    accepted = browser_with(cookies["otto"]).post(cancel, otto_form)
    assert accepted.status_code == 303  # a non-htmx POST redirects to the page
    assert Run.objects.get(pk=target.id).status == "cancelled"


def test_it_reads_everyones_permissions_in_one_query(
    django_assert_num_queries: Any,
) -> None:
    ensure_default_groups()
    operator = person("olivia", "operator")
    approver = person("alice", "approver")
    direct = User.objects.create_user(username="dora", password="pw")
    direct.user_permissions.add(Permission.objects.get(codename="cancel_run"))
    both = person("bob", "viewer")
    both.user_permissions.add(Permission.objects.get(codename="retry_run"))
    boss = User.objects.create_superuser(username="root", password="pw")
    nobody = User.objects.create_user(username="nina", password="pw")
    users = list(
        User.objects.filter(pk__in=[u.pk for u in (operator, approver, direct, both)]).order_by(
            "pk"
        )
    )
    users += list(User.objects.filter(pk__in=[boss.pk, nobody.pk]).order_by("pk"))

    with django_assert_num_queries(1):
        roles = sessions.permissions_of(users)
    # The user objects are asked nothing and written nothing: renders ask the roles.
    assert not any(
        vars(u).keys() & {"_perm_cache", "_user_perm_cache", "_group_perm_cache"} for u in users
    )

    for user in users:
        fresh = User.objects.get(pk=user.pk)
        role = roles[id(user)]
        assert role.superuser == fresh.is_superuser
        if not fresh.is_superuser:
            assert role.perms == fresh.get_all_permissions()
        for perm in ("runs.view_run", "runs.cancel_run", "runs.retry_run", "runs.approve_run"):
            assert role.has_perm(perm) == fresh.has_perm(perm), (user.username, perm)
    assert roles[id(users[0])] == live_roles.Role(
        frozenset(User.objects.get(pk=operator.pk).get_all_permissions())
    )
    assert roles[id(users[0])] != roles[id(users[1])]


def signed_in_session(user: User) -> str:
    """A session of ``user`` as a sign-in leaves it; its key."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    assert session.session_key is not None
    return session.session_key


def test_who_each_socket_is_costs_three_statements_and_follows_every_change(
    django_assert_num_queries: Any,
) -> None:
    """A push asks who each socket is in three statements however many sockets (sessions,
    users, permissions), and what it keeps per process (a session's claim, a password's
    session hash) never outlives the row it came from: a new password, a deactivated
    account, a sign-out, a session saved again for someone else and a forged one are each
    seen at the next push."""
    from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore
    from django.contrib.sessions.models import Session

    people = [person(f"p{n}", ("viewer", "operator", "approver")[n % 3]) for n in range(12)]
    keys = [signed_in_session(user) for user in people]
    scopes = [{"cookies": {"sessionid": key}} for key in keys] + [{"cookies": {}}]

    def who() -> dict[str, Any]:
        with django_assert_num_queries(3):
            return sessions.signed_in_users(scopes)

    first = who()
    assert [first[key].pk for key in keys] == [user.pk for user in people]
    again = who()  # what is kept per process answers the same
    assert again == first

    changed = people[0]
    changed.set_password("a new one")
    changed.save()
    people[1].is_active = False
    people[1].save()
    Session.objects.filter(session_key=keys[2]).delete()  # signed out
    # The session of people[3] saved again as people[4]'s: the new text is a new claim.
    moved = SessionStore(keys[3])
    moved[SESSION_KEY] = str(people[4].pk)
    moved[HASH_SESSION_KEY] = people[4].get_session_auth_hash()
    moved.save()
    # A row whose text was not signed with this server's secret claims nobody.
    forged = Session.objects.get(session_key=keys[5])
    forged.session_data = forged.session_data[:-4] + "AAAA"
    forged.save()

    after = who()
    assert after[keys[0]] is None
    assert after[keys[1]] is None
    assert after[keys[2]] is None
    assert after[keys[3]] is not None and after[keys[3]].pk == people[4].pk
    assert after[keys[5]] is None
    assert [after[key].pk for key in keys[6:]] == [user.pk for user in people[6:]]
    # The new password's sessions are good again once signed in with it.
    fresh = signed_in_session(User.objects.get(pk=changed.pk))
    scopes.append({"cookies": {"sessionid": fresh}})
    assert who()[fresh].pk == changed.pk


def test_a_role_is_answered_by_the_selectors_as_its_people_are() -> None:
    """A push asks the run store for a ``Role`` (``runs.access.Actor``) where a page asks
    for the signed-in user: both get the same answer, and the role carries no one's
    identity (``pk`` None, no name), so nothing of one person reaches another."""
    from runs.selectors import inbox_for_user, paused_for_user, runs_for_user

    approver, viewer = person("alice", "approver"), person("victor", "viewer")
    target, _lease, _cp, _request = interrupted(kind="auth_required")
    roles = sessions.permissions_of([approver, viewer])
    for user in (approver, viewer):
        role = roles[id(user)]
        assert role.pk is None and not hasattr(role, "get_username")
        for selector in (inbox_for_user, runs_for_user, paused_for_user):
            assert list(selector(user=role)) == list(selector(user=user)), selector
    assert [r.run_id for r in inbox_for_user(user=roles[id(approver)])] == [target.id]
    assert list(inbox_for_user(user=roles[id(viewer)])) == []
