"""Websocket consumers of the live dashboard: the inbox, the runs list, one run, and the
badge of every other page.

Each socket belongs to one page. At connect it needs a signed-in user (and, for a run,
one who may see that run; an outsider is refused before the handshake completes), and
joins the group every push goes to (``runs.broadcast``). Then, and after every push,
it re-reads what its page shows and sends the page's own named partials, rendered as
the page renders them, marked ``hx-swap-oob`` (htmx's ws extension swaps them in by id).

A socket that connects, or reconnects after a network drop, first gets what changed
since its page was rendered (the page's ``v`` token names what it shows), so nothing
is missed; htmx reconnects by itself.

Every render re-reads the session and the user: a signed-out user's socket closes
(4401), a user who lost ``runs.view_run`` gets nothing and is closed (4403); htmx does
not reconnect after either. Forms in a push get a fresh CSRF token of the user's own
cookie and fresh idempotency keys, exactly like the page.

Pushes carry only run ids, so a consumer keeps what it last sent to tell what is new:
the run page the last event number, the lists their rows and cards with versions. The
browser also keeps any part whose ``data-version`` did not change, with what the person
typed into it (app.js).
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, TypeVar

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib import auth
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.middleware.csrf import CsrfViewMiddleware
from django.template.loader import render_to_string
from django.utils import timezone, translation

from runs import broadcast
from runs.metrics import OPEN_WEBSOCKETS
from runs.models import InputRequest, Run
from runs.selectors import VIEW, inbox_for_user, permission_for_request_kind, run_get_for_user
from runs.states import RequestStatus
from runs.views._common import user_timezone
from runs.views.cards import build_card, card_version
from runs.views.inbox import TABS, inbox_context, inbox_requests, inbox_token
from runs.views.runs import run_context, run_list_context

logger = logging.getLogger(__name__)

T = TypeVar("T")
SIGNED_OUT = 4401
FORBIDDEN = 4403
MAX_RUN_IDS = 10_000


@dataclass
class Reply:
    html: str = ""
    close: int | None = None


def live_request(scope: dict[str, Any]) -> HttpRequest:
    """A request that stands for the socket's page at this moment.

    The session and the user are read again now, as an HTTP request would read them:
    a session that ended or whose password changed gives an anonymous user. The CSRF
    token comes from the page's own cookie, so a pushed form posts like a rendered one.
    """
    request = ASGIRequest({**scope, "type": "http", "method": "GET"}, io.BytesIO())
    engine = import_module(settings.SESSION_ENGINE)
    request.session = engine.SessionStore(request.COOKIES.get(settings.SESSION_COOKIE_NAME))
    request.user = auth.get_user(request)
    CsrfViewMiddleware(lambda _request: HttpResponse()).process_request(request)
    return request


def _in_thread(func: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """Run ``func`` in a worker thread, as a request: connections are closed after it.

    Not thread-sensitive: renders of many sockets do not queue behind the pages' views
    in the one thread Django keeps for sync code. The connections are closed inside the
    call (``CONN_MAX_AGE`` applies as to a request); channels' own clean-up runs outside
    the call's context and missed a connection opened by a render that closed its socket.
    """

    def call(*args: Any) -> T:
        try:
            return func(*args)
        finally:
            close_old_connections()

    return database_sync_to_async(call, thread_sensitive=False)


class LiveConsumer(AsyncWebsocketConsumer):
    """What every live socket does; subclasses say what their page shows."""

    joined = False
    counted = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=SIGNED_OUT)
            return
        self.params = QueryDict(self.scope.get("query_string", b"").decode("latin1"))
        if not await _in_thread(self.may_connect)(user):
            await self.close(code=FORBIDDEN)
            return
        # Join before reading: a change committed while the first render runs is pushed
        # again afterwards, never lost in between.
        await self.channel_layer.group_add(broadcast.GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        OPEN_WEBSOCKETS.inc()
        self.counted = True
        broadcast.attach_loop(asyncio.get_running_loop())
        await self.refresh(None)

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(broadcast.GROUP, self.channel_name)
            self.joined = False
        if self.counted:
            OPEN_WEBSOCKETS.dec()
            self.counted = False

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """The page sends nothing; whatever arrives is ignored."""

    async def runs_changed(self, message: dict[str, Any]) -> None:
        run_ids = message.get("run_ids")
        if not isinstance(run_ids, list):
            return
        await self.refresh(frozenset(str(r) for r in run_ids[:MAX_RUN_IDS]))

    async def refresh(self, run_ids: frozenset[str] | None) -> None:
        """Send what changed; ``run_ids`` None: the first render after (re)connecting."""
        reply: Reply = await _in_thread(self._render)(run_ids)
        if reply.close is not None:
            await self.close(code=reply.close)
        elif reply.html:
            await self.send(text_data=reply.html)

    def _render(self, run_ids: frozenset[str] | None) -> Reply:
        request = live_request(self.scope)
        if not request.user.is_authenticated:
            return Reply(close=SIGNED_OUT)
        if not self.may_see(request.user):
            return Reply(close=FORBIDDEN)
        language = translation.get_language_from_request(request)
        with translation.override(language), timezone.override(user_timezone(request)):
            request.LANGUAGE_CODE = translation.get_language()
            return Reply(html=self.render(request, run_ids))

    # Subclasses -------------------------------------------------------------------------

    def may_connect(self, user: Any) -> bool:
        return self.may_see(user)

    def may_see(self, user: Any) -> bool:
        return bool(user.has_perm(VIEW))

    def render(self, request: HttpRequest, run_ids: frozenset[str] | None) -> str:
        raise NotImplementedError

    # Shared -----------------------------------------------------------------------------

    badge: int | None = None

    def token(self) -> str:
        """What the page was rendered with (its ``v``); "" when it did not say."""
        return str(self.params.get("v", ""))[:64]

    def render_badge(self, request: HttpRequest, *, force: bool = False) -> str:
        """The nav badge, when its count changed since this socket last sent it."""
        count = inbox_for_user(user=request.user).count()
        if count == self.badge and not force:
            return ""
        self.badge = count
        request._holdpoint_inbox_count = count  # type: ignore[attr-defined]
        return render_to_string("base.html#inbox-count", {"oob": True}, request=request)

    def sent_badge(self, request: HttpRequest) -> None:
        self.badge = getattr(request, "_holdpoint_inbox_count", self.badge)


class BadgeConsumer(LiveConsumer):
    """Pages without a live list of their own keep the inbox badge in the nav current."""

    def may_see(self, user: Any) -> bool:
        return True  # the badge counts 0 for a user who may see no runs

    def render(self, request: HttpRequest, run_ids: frozenset[str] | None) -> str:
        if self.badge is None and self.token().isdigit():
            self.badge = int(self.token())  # the count the page was rendered with
        return self.render_badge(request)


class RunConsumer(LiveConsumer):
    """One run's page: status, header, controls, the pending card, attempts, timeline,
    checkpoints, the result; the side-effect report is fetched again when the ledger moved."""

    seq: int | None = None

    @property
    def run_id(self) -> str:
        return str(self.scope["url_route"]["kwargs"]["run_id"])

    def may_see(self, user: Any) -> bool:
        try:
            run_get_for_user(user=user, run_id=self.run_id)
        except Http404:
            return False
        return True

    def render(self, request: HttpRequest, run_ids: frozenset[str] | None) -> str:
        if run_ids is not None and self.run_id not in run_ids:
            return self.render_badge(request)
        run = Run.objects.filter(pk=self.run_id).first()
        if run is None:
            return ""
        known = self.seq
        if known is None and self.token().isdigit():
            known = int(self.token())
        if known is not None and run.last_event_seq <= known:
            self.seq = max(known, run.last_event_seq)
            return self.render_badge(request)
        context = run_context(request, run)
        context["oob"] = True
        context["refresh_report"] = (
            known is not None
            and run.events.filter(seq__gt=known, type__startswith="side_effect.").exists()
        )
        html = render_to_string("runs/run_detail.html#run-live", context, request=request)
        self.seq = run.last_event_seq
        self.sent_badge(request)
        return html


class InboxConsumer(LiveConsumer):
    """The inbox: cards come and go as requests are asked and answered; a card that
    expires or closes stays, read-only, saying so; one answered by someone else leaves."""

    shown: list[str] | None = None
    versions: dict[str, str]

    @property
    def tab(self) -> str:
        tab = str(self.params.get("tab", "needs"))
        return tab if tab in dict(TABS) else "needs"

    def render(self, request: HttpRequest, run_ids: frozenset[str] | None) -> str:
        user = request.user
        keep = self._keep(user, run_ids)
        requests = inbox_requests(user, self.tab, keep=keep)
        ids = [r.id for r in requests]
        versions = {
            r.id: card_version(r, can_answer=user.has_perm(permission_for_request_kind(r.kind)))
            for r in requests
        }
        if self.shown is None:
            # First render: the page's token says whether it already shows exactly this.
            if inbox_token(versions.items()) != self.token():
                return self._render_list(request, requests)
            self.shown, self.versions = ids, versions
            return self.render_badge(request)
        if ids != self.shown:
            return self._render_list(request, requests)
        html: list[str] = [
            render_to_string(
                "runs/inbox.html#request-card",
                {"card": build_card(r, user=user, origin="inbox"), "card_oob": True},
                request=request,
            )
            for r in requests
            if versions[r.id] != self.versions.get(r.id)
        ]
        self.versions = versions
        html.append(self._counts(request))
        return "".join(html)

    def _keep(self, user: Any, run_ids: frozenset[str] | None) -> list[str]:
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

    def _render_list(self, request: HttpRequest, requests: list[InputRequest]) -> str:
        context = inbox_context(request.user, self.tab, requests=requests)
        context["oob"] = True
        self.versions = {card.req.id: card.version for card in context["cards"]}
        self.shown = list(self.versions)
        html = render_to_string("runs/inbox.html#inbox-list", context, request=request)
        return html + self._counts(request, force=True)

    def _counts(self, request: HttpRequest, *, force: bool = False) -> str:
        badge = self.render_badge(request, force=force)
        if not badge:
            return ""
        tab_count = render_to_string("runs/inbox.html#inbox-tab-count", {"oob": True}, request)
        return badge + tab_count


class RunListConsumer(LiveConsumer):
    """The runs list with the page's filters: status counts, and its rows as they change;
    the whole table body when runs join or leave the page."""

    shown: list[str] | None = None
    token_seen = ""

    def render(self, request: HttpRequest, run_ids: frozenset[str] | None) -> str:
        context = run_list_context(request.user, self.params)
        ids = [row["run"].id for row in context["rows"]]
        token = context["live_token"]
        if self.shown is None and token == self.token():
            self.shown, self.token_seen = ids, token
            return self.render_badge(request)
        if token == self.token_seen:
            return self.render_badge(request)
        context["oob"] = True
        html: str
        if ids != self.shown:
            html = render_to_string("runs/run_list.html#runs-live", context, request=request)
            self.sent_badge(request)
        else:
            changed = [
                render_to_string(
                    "runs/run_list.html#run-row",
                    {"row": row, "row_oob": True},
                    request=request,
                )
                for row in context["rows"]
                if run_ids is None or row["run"].id in run_ids
            ]
            tabs = render_to_string("runs/run_list.html#runs-tabs", context, request=request)
            html = tabs + "".join(changed) + self.render_badge(request)
        self.shown, self.token_seen = ids, token
        return html
