"""Websocket consumers of the live dashboard: the inbox, the runs list, one run, and the
badge of every other page.

Each socket belongs to one page. At connect it needs a signed-in user (and, for a run,
one who may see that run; an outsider is refused before the handshake completes). Then,
and after every push, it re-reads what its page shows and sends the page's own named
partials, rendered as the page renders them, marked ``hx-swap-oob`` (htmx's ws extension
swaps them in by id).

A socket that connects, or reconnects after a network drop, first gets what changed
since its page was rendered (the page's ``v`` token names what it shows), so nothing is
missed; htmx reconnects by itself.

The sockets of a process share one ``Hub``: one channel in the push group
(``live.broadcast``), and one render at a time for all of them. A push is rendered in
one worker thread with one database connection: the session, user and permissions of
every socket are checked again in four queries (a signed-out user's socket closes with
4401, one who lost ``runs.view_run`` gets nothing and is closed with 4403; htmx does not
reconnect after either), and what a page shows every user alike (a run's status,
attempts, timeline) is rendered once for all the sockets that show it. What depends on
what the user may do (the run page's cancel and retry forms and question card, the
badge's count) is rendered once per ``Role`` (a set of permissions) and push, and only
when it changed; each socket then fills in its own CSRF token (from its own cookie) and
fresh idempotency keys, exactly like the page (``personalize``). The inbox is still
rendered per socket. Pushes arriving during a render are merged into the next one.

Pushes carry only ids, so each socket keeps what it last sent to tell what is new: the
run page the last event number, the lists their rows and cards with versions. The
browser also keeps any part whose ``data-version`` did not change, with what the person
typed into it (app.js).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import re
import secrets
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from importlib import import_module
from itertools import chain
from typing import Any, TypeVar

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.auth.models import Permission
from django.contrib.sessions.models import Session
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.middleware.csrf import CsrfViewMiddleware, get_token
from django.template.loader import render_to_string
from django.utils import timezone, translation
from django.utils.crypto import constant_time_compare

from dashboard.actions import new_idempotency_key, user_timezone
from dashboard.views.cards import build_card, card_version
from dashboard.views.inbox import TABS, inbox_context, inbox_requests, inbox_token
from dashboard.views.runs import (
    run_context,
    run_controls_state,
    run_list_context,
    run_retry_blockers,
    run_shared_context,
)
from live import broadcast
from runs.metrics import OPEN_WEBSOCKETS
from runs.models import InputRequest, Run
from runs.selectors import VIEW, inbox_for_user, permission_for_request_kind, run_get_for_user
from runs.states import RequestStatus

logger = logging.getLogger(__name__)

T = TypeVar("T")
DATABASE_SESSIONS = (
    "django.contrib.sessions.backends.db",
    "django.contrib.sessions.backends.cached_db",
)
SIGNED_OUT = 4401
FORBIDDEN = 4403
MAX_RUN_IDS = 10_000
# channels_redis forgets a group member after a day, and a restarted Redis forgets all of
# them: the hub joins again every few minutes (one ZADD).
REJOIN_SECONDS = 300.0


def _in_thread(func: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """Run ``func`` in a worker thread, as a request: connections are closed after it.

    Not thread-sensitive: renders do not queue behind the pages' views in the one thread
    Django keeps for sync code. The connections are closed inside the call (channels'
    own clean-up runs outside the call's context and missed some).
    """

    def call(*args: Any) -> T:
        try:
            return func(*args)
        finally:
            close_old_connections()

    return database_sync_to_async(call, thread_sensitive=False)


# --- One render for every socket of the process ---------------------------------------------


@dataclass
class Change:
    """What a render is about: ``None`` for a socket's first render (a snapshot)."""

    run_ids: frozenset[str]
    request_run_ids: frozenset[str]


@dataclass
class Reply:
    html: str = ""
    close: int | None = None


@dataclass
class Batch:
    """Shared by the sockets of one render: what one computed, the others reuse."""

    memo: dict[Any, Any] = field(default_factory=dict)

    def get(self, key: Any, make: Callable[[], T]) -> T:
        if key not in self.memo:
            self.memo[key] = make()
        value: T = self.memo[key]
        return value


@dataclass(frozen=True)
class Role:
    """Everyone with the same permissions: what a render shared by their sockets may know.

    It stands in for the user in the parts of a page that depend on what the user may do
    (the cancel and retry forms, the question's card, the badge's count): they are
    rendered once per role and push, not once per socket. It has permissions and nothing
    else (no name, no id, no session), so a fragment rendered for a role cannot carry
    anything of one person to another; what must be a person's own (the CSRF token,
    fresh idempotency keys) is filled in per socket (``Personal``).
    """

    perms: frozenset[str]
    superuser: bool = False

    is_active = True
    is_authenticated = True
    is_anonymous = False
    is_staff = False
    pk = None

    @property
    def is_superuser(self) -> bool:
        return self.superuser

    def get_username(self) -> str:
        return ""

    def has_perm(self, perm: str, obj: Any = None) -> bool:
        return obj is None and (self.superuser or perm in self.perms)

    def has_perms(self, perm_list: Iterable[str], obj: Any = None) -> bool:
        return all(self.has_perm(perm, obj) for perm in perm_list)

    def has_module_perms(self, app_label: str) -> bool:
        return self.superuser or any(p.startswith(app_label + ".") for p in self.perms)

    def get_all_permissions(self, obj: Any = None) -> set[str]:
        return set(self.perms) if obj is None else set()


NOBODY = Role(frozenset())


@dataclass
class Viewer:
    user: Any
    role: Role

    @property
    def may_view(self) -> bool:
        """Still has runs.view_run."""
        return self.role.has_perm(VIEW)


def signed_in_users(scopes: Iterable[dict[str, Any]]) -> dict[str, Viewer | None]:
    """Who each socket's session stands for now, or None; and what each may do. Four
    queries for them all, however many sockets.

    The same checks as ``django.contrib.auth.get_user``: a session that ended (signed out,
    expired) or whose password changed since gives no user, nor does an inactive one.
    Permissions are read afresh (``permissions_of``).
    """
    keys = {_session_key(scope) for scope in scopes} - {""}
    claims: dict[str, tuple[str, str]] = {}
    for key, data in _sessions(keys):
        if SESSION_KEY in data:
            claims[key] = (str(data[SESSION_KEY]), str(data.get(HASH_SESSION_KEY)))
    user_model = get_user_model()
    user_ids = {user_id for user_id, _hash in claims.values()}
    users = {str(u.pk): u for u in user_model._default_manager.filter(pk__in=user_ids)}
    result: dict[str, Viewer | None] = dict.fromkeys(keys)
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
        result[key] = Viewer(user, roles[id(user)])
    return result


MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


def permissions_of(users: list[Any]) -> dict[int, Role]:
    """Each (active) user's role, by ``id(user)``: two queries for them all.

    The same answer as ``user.get_all_permissions()`` with Django's ``ModelBackend`` (the
    user's own permissions and their groups'; a superuser has every one), which also
    fills each user's permission cache, so ``user.has_perm`` asks the database no more.
    With other authentication backends each user is asked in turn.
    """
    if list(settings.AUTHENTICATION_BACKENDS) != [MODEL_BACKEND]:
        return {
            id(u): Role(frozenset(u.get_all_permissions()), bool(u.is_superuser)) for u in users
        }
    roles: dict[int, Role] = {}
    ordinary = {str(u.pk): u for u in users if not u.is_superuser}
    found: dict[str, set[str]] = {pk: set() for pk in ordinary}
    own = Permission.objects.filter(user__in=list(ordinary)).values_list(
        "user", "content_type__app_label", "codename"
    )
    via_groups = Permission.objects.filter(group__user__in=list(ordinary)).values_list(
        "group__user", "content_type__app_label", "codename"
    )
    for user_pk, app_label, codename in chain(own, via_groups):
        found[str(user_pk)].add(f"{app_label}.{codename}")
    for key, user in ordinary.items():
        user._perm_cache = set(found[key])
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


def _session_key(scope: dict[str, Any]) -> str:
    return str(scope.get("cookies", {}).get(settings.SESSION_COOKIE_NAME, ""))


def live_request(scope: dict[str, Any], user: Any) -> HttpRequest:
    """A request that stands for the socket's page at this moment, for ``user``.

    The CSRF token comes from the page's own cookie, so a pushed form posts like a
    rendered one; language and time zone come from the page's cookies and headers.
    """
    request = ASGIRequest({**scope, "type": "http", "method": "GET"}, io.BytesIO())
    request.user = user
    CsrfViewMiddleware(lambda _request: HttpResponse()).process_request(request)
    return request


def role_request(request: HttpRequest, role: Role) -> HttpRequest:
    """A request for ``role`` with nothing of the socket's person in it (no cookies, no
    headers, no query): only its page's path. Language and time zone are the render's."""
    scope = {
        "type": "http",
        "method": "GET",
        "path": request.path,
        "root_path": getattr(request, "scope", {}).get("root_path", ""),
        "headers": [],
        "query_string": b"",
    }
    neutral = ASGIRequest(scope, io.BytesIO())
    neutral.user = role  # type: ignore[assignment]  # it quacks like a user, on purpose
    return neutral


# What a role's render leaves for each socket to fill in. The mark is secret and new in
# every process, so no text an agent sent (a prompt, a context item) can contain it.
_MARK = f"hp{secrets.token_hex(8)}"
_PERSONAL = re.compile(_MARK + r"-(csrf|key\d+)")


def personal(name: str) -> str:
    """A mark for a value that must be the socket's own: "csrf", or "key<n>" for a form's
    idempotency key (every socket gets its own, as every page render does)."""
    return f"{_MARK}-{name}"


def personalize(html: str, request: HttpRequest) -> str:
    """``html`` rendered for a role, made this socket's: the CSRF token of its own cookie
    (freshly masked, like a page's) and fresh idempotency keys."""
    if _MARK not in html:
        return html
    keys: dict[str, str] = {}

    def fill(match: re.Match[str]) -> str:
        if match[1] == "csrf":
            return get_token(request)
        return keys.setdefault(match[1], new_idempotency_key())

    return _PERSONAL.sub(fill, html)


def render_batch(
    sockets: list[LiveConsumer], change: Change | None, snapshots: set[LiveConsumer]
) -> list[tuple[LiveConsumer, Reply]]:
    """Render one push (``change``) for ``sockets``, and first renders for ``snapshots``."""
    users = signed_in_users(s.scope for s in sockets)
    batch = Batch()
    replies = []
    for socket in sockets:
        viewer = users.get(_session_key(socket.scope))
        if viewer is None:
            replies.append((socket, Reply(close=SIGNED_OUT)))
            continue
        if socket.requires_view and not viewer.may_view:
            replies.append((socket, Reply(close=FORBIDDEN)))
            continue
        first = socket in snapshots
        if not first and (change is None or not socket.concerned(change)):
            continue
        request = live_request(socket.scope, viewer.user)
        language = translation.get_language_from_request(request)
        try:
            with translation.override(language), timezone.override(user_timezone(request)):
                request.LANGUAGE_CODE = translation.get_language()
                html = socket.render(request, viewer.role, None if first else change, batch)
        except Exception:
            # One page that cannot be rendered must not keep the others waiting.
            logger.exception("live render failed for %s", socket.scope.get("path"))
            continue
        if html:
            replies.append((socket, Reply(html=html)))
    return replies


class Hub:
    """The live sockets of one event loop (one web process), their one channel in the
    push group, and their renders, one at a time."""

    def __init__(self) -> None:
        self.sockets: set[LiveConsumer] = set()
        self.snapshots: set[LiveConsumer] = set()
        self.run_ids: set[str] = set()
        self.request_run_ids: set[str] = set()
        self.changed = False
        self.wake = asyncio.Event()
        self.channel = ""
        self.tasks: list[asyncio.Task[None]] = []
        self.lock = asyncio.Lock()

    async def add(self, socket: LiveConsumer) -> None:
        async with self.lock:
            if not self.tasks:
                await self._start()
            self.sockets.add(socket)
            self.snapshots.add(socket)
            self.wake.set()

    async def remove(self, socket: LiveConsumer) -> None:
        async with self.lock:
            self.sockets.discard(socket)
            self.snapshots.discard(socket)
            if not self.sockets and self.tasks:
                await self._stop()

    async def _start(self) -> None:
        layer = get_channel_layer()
        assert layer is not None, "the live dashboard needs CHANNEL_LAYERS"
        self.channel = await layer.new_channel()
        await layer.group_add(broadcast.GROUP, self.channel)
        broadcast.attach_loop(asyncio.get_running_loop())
        self.tasks = [
            asyncio.create_task(self._receive(layer)),
            asyncio.create_task(self._render()),
            asyncio.create_task(self._rejoin(layer)),
        ]

    async def _stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks = []
        layer = get_channel_layer()
        if layer is not None:
            await layer.group_discard(broadcast.GROUP, self.channel)

    async def _rejoin(self, layer: Any) -> None:
        while True:
            await asyncio.sleep(REJOIN_SECONDS)
            with contextlib.suppress(Exception):
                await layer.group_add(broadcast.GROUP, self.channel)

    async def _receive(self, layer: Any) -> None:
        while True:
            try:
                message = await layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any layer failure: rejoin and catch up
                # Redis went away: pushes were lost meanwhile. Once it answers again, join
                # again and have every page catch up, as after a reconnect.
                logger.warning("live pushes: channel layer receive failed: %r", exc)
                await asyncio.sleep(1.0)
                with contextlib.suppress(Exception):
                    await layer.group_add(broadcast.GROUP, self.channel)
                    self.snapshots |= self.sockets
                    self.wake.set()
                continue
            if message.get("type") != broadcast.MESSAGE_TYPE:
                continue
            self.run_ids |= _ids(message.get("run_ids"))
            # A message without the field (an older sender) may be about questions too.
            requests = message.get("request_run_ids", message.get("run_ids"))
            self.request_run_ids |= _ids(requests)
            self.changed = True
            self.wake.set()

    async def _render(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            change = None
            if self.changed:
                change = Change(frozenset(self.run_ids), frozenset(self.request_run_ids))
                self.run_ids, self.request_run_ids, self.changed = set(), set(), False
            snapshots, self.snapshots = self.snapshots, set()
            sockets = list(self.sockets)
            if not sockets:
                continue
            try:
                replies = await _in_thread(render_batch)(sockets, change, snapshots)
            except Exception:
                logger.exception("live render failed")
                continue
            for socket, reply in replies:
                await socket.deliver(reply)


def _ids(value: Any) -> set[str]:
    if not isinstance(value, list):
        return set()
    return {str(item) for item in value[:MAX_RUN_IDS]}


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def hub() -> Hub:
    loop = asyncio.get_running_loop()
    if loop not in _hubs:
        _hubs[loop] = Hub()
    return _hubs[loop]


# --- The sockets -------------------------------------------------------------------------


class LiveConsumer(AsyncWebsocketConsumer):
    """What every live socket does; subclasses say what their page shows."""

    registered = False
    counted = False
    badge: int | None = None
    requires_view = True  # checked again at every render (the hub, in bulk)

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=SIGNED_OUT)
            return
        self.params = QueryDict(self.scope.get("query_string", b"").decode("latin1"))
        if not await _in_thread(self.may_connect)(user):
            await self.close(code=FORBIDDEN)
            return
        await self.accept()
        OPEN_WEBSOCKETS.inc()
        self.counted = True
        # Joining comes before the first read (the hub's next render): a change committed
        # meanwhile is rendered after it, never lost in between.
        await hub().add(self)
        self.registered = True

    async def disconnect(self, code: int) -> None:
        if self.registered:
            await hub().remove(self)
            self.registered = False
        if self.counted:
            OPEN_WEBSOCKETS.dec()
            self.counted = False

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The page sends nothing; whatever arrives is ignored."""

    async def deliver(self, reply: Reply) -> None:
        if not self.registered:
            return
        if reply.close is not None:
            await hub().remove(self)
            self.registered = False
            await self.close(code=reply.close)
        elif reply.html:
            await self.send(text_data=reply.html)

    # Subclasses -------------------------------------------------------------------------

    def may_connect(self, user: Any) -> bool:
        return bool(user.has_perm(VIEW)) if self.requires_view else True

    def concerned(self, change: Change) -> bool:
        """Whether ``change`` may alter what this page shows."""
        return bool(change.request_run_ids)

    def render(self, request: HttpRequest, role: Role, change: Change | None, batch: Batch) -> str:
        """What to send for ``change``: ``request`` stands for the socket's user, ``role``
        for everyone who may do what they may do."""
        raise NotImplementedError

    # Shared -----------------------------------------------------------------------------

    def token(self) -> str:
        """What the page was rendered with (its ``v``); "" when it did not say."""
        return str(self.params.get("v", ""))[:64]

    def render_badge(
        self, request: HttpRequest, role: Role, batch: Batch, *, force: bool = False
    ) -> str:
        """The nav badge, when its count changed since this socket last sent it. The count
        depends on what the user may answer: counted once per role."""
        count = batch.get(("badge", role), lambda: inbox_for_user(user=role).count())
        if count == self.badge and not force:
            return ""
        self.badge = count
        request._holdpoint_inbox_count = count  # type: ignore[attr-defined]
        return batch.get(
            ("badge-html", count, translation.get_language()),
            lambda: render_to_string("base.html#inbox-count", {"oob": True}, request=request),
        )


class BadgeConsumer(LiveConsumer):
    """Pages without a live list of their own keep the inbox badge in the nav current."""

    requires_view = False  # signed in is enough: the badge counts 0 for who may see no runs

    def render(self, request: HttpRequest, role: Role, change: Change | None, batch: Batch) -> str:
        if self.badge is None and self.token().isdigit():
            self.badge = int(self.token())  # the count the page was rendered with
        return self.render_badge(request, role, batch)


class RunConsumer(LiveConsumer):
    """One run's page: status, header, attempts, timeline, checkpoints and result (alike
    for everyone), the user's controls and pending card (when they change), the badge;
    the side-effect report is fetched again when the ledger moved."""

    seq: int | None = None
    controls: str | None = None

    @property
    def run_id(self) -> str:
        return str(self.scope["url_route"]["kwargs"]["run_id"])

    def may_connect(self, user: Any) -> bool:
        """An outsider, or a run that does not exist: refused, and nothing says which."""
        try:
            run_get_for_user(user=user, run_id=self.run_id)
        except Http404:
            return False
        return True

    def concerned(self, change: Change) -> bool:
        return self.run_id in change.run_ids or bool(change.request_run_ids)

    def render(self, request: HttpRequest, role: Role, change: Change | None, batch: Batch) -> str:
        parts = []
        if change is None or self.run_id in change.run_ids:
            parts.append(self._render_run(request, role, batch, first=change is None))
        if change is None or change.request_run_ids:
            parts.append(self.render_badge(request, role, batch, force=change is None))
        return "".join(parts)

    def _render_run(self, request: HttpRequest, role: Role, batch: Batch, *, first: bool) -> str:
        run = batch.get(("run", self.run_id), lambda: Run.objects.filter(pk=self.run_id).first())
        if run is None:
            return ""
        known = self.seq
        if known is None and self.token().isdigit():
            known = int(self.token())
        blockers = batch.get(("blockers", run.id), lambda: run_retry_blockers(run))
        controls = run_controls_state(run, blockers)
        if known is not None and run.last_event_seq <= known:
            self.seq = max(known, run.last_event_seq)
            if self.controls is None:
                self.controls = controls  # the page was rendered with these
            return ""
        language, zone = translation.get_language(), timezone.get_current_timezone_name()
        shared = batch.get(("shared-context", run.id), lambda: run_shared_context(run))
        # What everyone sees alike is rendered as nobody in particular: a role without
        # permissions, with no cookie, so it cannot differ from one socket to another.
        html = batch.get(
            ("shared", run.id, language, zone),
            lambda: render_to_string(
                "dashboard/run_detail.html#run-live-shared",
                shared,
                role_request(request, NOBODY),
            ),
        )
        parts: list[str] = [html]
        if first or controls != self.controls:
            for_role = batch.get(
                ("user", run.id, role, language, zone),
                lambda: _render_run_for_role(request, role, run, shared, blockers),
            )
            parts.append(personalize(for_role, request))
            self.controls = controls
        ledger_moved = known is not None and batch.get(
            ("ledger", run.id, known),
            lambda: run.events.filter(seq__gt=known, type__startswith="side_effect.").exists(),
        )
        if ledger_moved:
            parts.append(
                render_to_string(
                    "dashboard/run_detail.html#run-report-refresh",
                    {"run": run, "oob": True},
                    request,
                )
            )
        self.seq = run.last_event_seq
        return "".join(parts)


def _render_run_for_role(
    request: HttpRequest, role: Role, run: Run, shared: dict[str, Any], blockers: list[str]
) -> str:
    """The run page's controls and question card as ``role`` sees them, with marks where
    each socket puts its own CSRF token and idempotency keys (``personalize``)."""
    neutral = role_request(request, role)
    context = run_context(neutral, run, shared=shared, retry_blockers=blockers)
    context["csrf_token"] = personal("csrf")
    context["cancel_key"], context["retry_key"] = personal("key0"), personal("key1")
    for n, name in enumerate(("pending_card", "last_card"), start=2):
        if context[name] is not None:
            context[name].key = personal(f"key{n}")
    return render_to_string("dashboard/run_detail.html#run-live-user", context, neutral)


class InboxConsumer(LiveConsumer):
    """The inbox: cards come and go as requests are asked and answered; a card that
    expires or closes stays, read-only, saying so; one answered by someone else leaves."""

    shown: list[str] | None = None
    versions: dict[str, str]

    @property
    def tab(self) -> str:
        tab = str(self.params.get("tab", "needs"))
        return tab if tab in dict(TABS) else "needs"

    def render(self, request: HttpRequest, role: Role, change: Change | None, batch: Batch) -> str:
        user = request.user
        requests = inbox_requests(user, self.tab, keep=self._keep(user))
        ids = [r.id for r in requests]
        versions = {
            r.id: card_version(r, can_answer=user.has_perm(permission_for_request_kind(r.kind)))
            for r in requests
        }
        if self.shown is None:
            # First render: the page's token says whether it already shows exactly this.
            if inbox_token(versions.items()) != self.token():
                return self._render_list(request, role, batch, requests)
            self.shown, self.versions = ids, versions
            return self._counts(request, role, batch, force=True)
        if ids != self.shown:
            return self._render_list(request, role, batch, requests)
        html: list[str] = [
            render_to_string(
                "dashboard/inbox.html#request-card",
                {"card": build_card(r, user=user, origin="inbox"), "card_oob": True},
                request=request,
            )
            for r in requests
            if versions[r.id] != self.versions.get(r.id)
        ]
        self.versions = versions
        html.append(self._counts(request, role, batch))
        return "".join(html)

    def _keep(self, user: Any) -> list[str]:
        """Cards on the page whose request left the list: keep the ones a person should
        see closed (expired, closed with the run, answered by this user)."""
        if not self.shown or self.tab not in ("needs", "all"):
            return []
        closed = InputRequest.objects.filter(pk__in=self.shown).exclude(
            status=RequestStatus.PENDING
        )
        return [
            req_id
            for req_id, status, answered_by in closed.values_list("id", "status", "answered_by")
            if status != RequestStatus.ANSWERED or answered_by == user.pk
        ]

    def _render_list(
        self, request: HttpRequest, role: Role, batch: Batch, requests: list[InputRequest]
    ) -> str:
        context = inbox_context(request.user, self.tab, requests=requests)
        context["oob"] = True
        self.versions = {card.req.id: card.version for card in context["cards"]}
        self.shown = list(self.versions)
        html = render_to_string("dashboard/inbox.html#inbox-list", context, request=request)
        return html + self._counts(request, role, batch, force=True)

    def _counts(
        self, request: HttpRequest, role: Role, batch: Batch, *, force: bool = False
    ) -> str:
        badge = self.render_badge(request, role, batch, force=force)
        if not badge:
            return ""
        tab_count = render_to_string("dashboard/inbox.html#inbox-tab-count", {"oob": True}, request)
        return badge + tab_count


class RunListConsumer(LiveConsumer):
    """The runs list with the page's filters: status counts, and its rows as they change;
    the whole table body when runs join or leave the page."""

    shown: list[str] | None = None
    token_seen = ""

    def concerned(self, change: Change) -> bool:
        return bool(change.run_ids)

    def render(self, request: HttpRequest, role: Role, change: Change | None, batch: Batch) -> str:
        query = self.scope.get("query_string", b"")
        zone = timezone.get_current_timezone_name()
        key = ("runs", query, translation.get_language(), zone)
        context = batch.get(key, lambda: run_list_context(request.user, self.params))
        ids = [row["run"].id for row in context["rows"]]
        token = context["live_token"]
        badge = ""
        if change is None or change.request_run_ids:
            badge = self.render_badge(request, role, batch, force=change is None)
        if self.shown is None and token == self.token():
            self.shown, self.token_seen = ids, token
            return badge
        if token == self.token_seen:
            return badge
        context = {**context, "oob": True}
        html: str
        if ids != self.shown:
            html = render_to_string("dashboard/run_list.html#runs-live-rows", context, request)
        else:
            changed = [
                render_to_string(
                    "dashboard/run_list.html#run-row", {"row": row, "row_oob": True}, request
                )
                for row in context["rows"]
                if change is None or row["run"].id in change.run_ids
            ]
            tabs = render_to_string("dashboard/run_list.html#runs-tabs", context, request)
            html = tabs + "".join(changed)
        self.shown, self.token_seen = ids, token
        return html + badge
