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

import logging
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer
from django.http import Http404, HttpRequest, QueryDict
from django.template.loader import render_to_string
from django.utils import timezone, translation

from dashboard.views.cards import build_card, card_version
from dashboard.views.inbox import TABS, inbox_context, inbox_requests, inbox_token
from dashboard.views.runs import (
    run_context,
    run_controls_state,
    run_list_context,
    run_retry_blockers,
    run_shared_context,
)
from live.hub import FORBIDDEN, SIGNED_OUT, Batch, Change, Reply, _in_thread, hub
from live.roles import Person, Role, personal, personalize, role_request
from runs.metrics import OPEN_WEBSOCKETS
from runs.models import InputRequest, Run
from runs.selectors import VIEW, inbox_for_user, permission_for_request_kind, run_get_for_user
from runs.states import RequestStatus

logger = logging.getLogger(__name__)


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

    def render(
        self, request: HttpRequest, person: Person, change: Change | None, batch: Batch
    ) -> str:
        """What to send for ``change``: ``request`` stands for the socket's page (no user),
        ``person`` for who looks, and ``person.role`` for everyone who may do what they may
        do (what is rendered once for many)."""
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
        return batch.get(
            ("badge-html", count, translation.get_language()),
            lambda: render_to_string(
                "base.html#inbox-count", {"oob": True, "inbox_n": count}, request=request
            ),
        )


class BadgeConsumer(LiveConsumer):
    """Pages without a live list of their own keep the inbox badge in the nav current."""

    requires_view = False  # signed in is enough: the badge counts 0 for who may see no runs

    def render(
        self, request: HttpRequest, person: Person, change: Change | None, batch: Batch
    ) -> str:
        if self.badge is None and self.token().isdigit():
            self.badge = int(self.token())  # the count the page was rendered with
        return self.render_badge(request, person.role, batch)


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

    def render(
        self, request: HttpRequest, person: Person, change: Change | None, batch: Batch
    ) -> str:
        role = person.role
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
        # What everyone sees alike is rendered for nobody in particular: a request with
        # no user and no cookie, so it cannot differ from one socket to another.
        html = batch.get(
            ("shared", run.id, language, zone),
            lambda: render_to_string(
                "dashboard/run_detail.html#run-live-shared",
                shared,
                role_request(request),
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
    neutral = role_request(request)
    context = run_context(neutral, run, who=role, shared=shared, retry_blockers=blockers)
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

    def render(
        self, request: HttpRequest, person: Person, change: Change | None, batch: Batch
    ) -> str:
        role, user = person.role, person
        requests = inbox_requests(user, self.tab, keep=self._keep(user))
        ids = [r.id for r in requests]
        versions = {
            r.id: card_version(r, can_answer=user.has_perm(permission_for_request_kind(r.kind)))
            for r in requests
        }
        if self.shown is None:
            # First render: the page's token says whether it already shows exactly this.
            if inbox_token(versions.items()) != self.token():
                return self._render_list(request, person, batch, requests)
            self.shown, self.versions = ids, versions
            return self._counts(request, role, batch, force=True)
        if ids != self.shown:
            return self._render_list(request, person, batch, requests)
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

    def _keep(self, user: Person) -> list[str]:
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
        self, request: HttpRequest, person: Person, batch: Batch, requests: list[InputRequest]
    ) -> str:
        context = inbox_context(person, self.tab, requests=requests)
        context["oob"] = True
        self.versions = {card.req.id: card.version for card in context["cards"]}
        self.shown = list(self.versions)
        html = render_to_string("dashboard/inbox.html#inbox-list", context, request=request)
        return html + self._counts(request, person.role, batch, force=True)

    def _counts(
        self, request: HttpRequest, role: Role, batch: Batch, *, force: bool = False
    ) -> str:
        badge = self.render_badge(request, role, batch, force=force)
        if not badge:
            return ""
        tab_count = render_to_string(
            "dashboard/inbox.html#inbox-tab-count", {"oob": True, "inbox_n": self.badge}, request
        )
        return badge + tab_count


class RunListConsumer(LiveConsumer):
    """The runs list with the page's filters: status counts, and its rows as they change;
    the whole table body when runs join or leave the page."""

    shown: list[str] | None = None
    token_seen = ""

    def concerned(self, change: Change) -> bool:
        return bool(change.run_ids)

    def render(
        self, request: HttpRequest, person: Person, change: Change | None, batch: Batch
    ) -> str:
        query = self.scope.get("query_string", b"")
        zone = timezone.get_current_timezone_name()
        key = ("runs", query, translation.get_language(), zone)
        context = batch.get(key, lambda: run_list_context(person, self.params))
        ids = [row["run"].id for row in context["rows"]]
        token = context["live_token"]
        badge = ""
        if change is None or change.request_run_ids:
            badge = self.render_badge(request, person.role, batch, force=change is None)
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
