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
every socket are checked again in three queries (a signed-out user's socket closes with
4401, one who lost ``runs.view_run`` gets nothing and is closed with 4403; htmx does not
reconnect after either), and what a page shows every user alike (a run's status,
attempts, the timeline's new rows) is rendered once for all the sockets that show it.
The timeline is never sent whole: its new rows are appended to the page's list (with
the last ``TIMELINE_OVERLAP`` it has, which it keeps by id), and the checkpoints only
when they changed, so a frame stays small however long the run. What depends on what
the user may do (the run page's cancel and retry forms and question card, the badge's
count) is rendered once per ``Role`` (a set of permissions) and push, and only when it
changed or the person's role did; each socket then fills in its own CSRF token (from
its own cookie) and fresh idempotency keys, exactly like the page (``personalize``).
Each frame is sent as soon as its page is rendered. An approval whose
policy judges people apart (``runs.selectors.judged_per_person``: a decision recorded,
groups, no self-approval) is rendered, and the badge counted, per ``Person`` instead:
two approvers with the same permissions may differ in what they may do with it. The
inbox is still rendered per socket. Pushes arriving during a render are merged into the
next one.

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

from dashboard.pages.cards import build_card, card_version
from dashboard.pages.inbox import TABS, inbox_context, inbox_requests, inbox_token
from dashboard.pages.runs import (
    RunRequests,
    run_context,
    run_controls_state,
    run_list_context,
    run_requests_with,
    run_retry_blockers,
    run_shared_context,
    run_waiting_context,
    timeline_rows,
)
from dashboard.pages.workers import workers_context
from live.hub import FORBIDDEN, SIGNED_OUT, Batch, Change, Reply, _in_thread, hub
from live.roles import Person, Role, personal, personalize, role_request
from runs.metrics import OPEN_WEBSOCKETS
from runs.models import InputRequest, Run
from runs.selectors import (
    VIEW,
    VIEW_WORKERS,
    WAITS_FOR_WORKER,
    inbox_for_user,
    judged_per_person,
    judged_per_person_q,
    permission_for_request_kind,
    run_get_for_user,
)
from runs.states import RequestStatus

logger = logging.getLogger(__name__)

# Timeline rows a push sends again before the new ones (``RunConsumer``).
TIMELINE_OVERLAP = 1


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
        self, request: HttpRequest, person: Person, batch: Batch, *, force: bool = False
    ) -> str:
        """The nav badge, when its count changed since this socket last sent it: what this
        person can act on now ("Needs me", ``inbox_for_user``, the list's query). Counted
        once per role while nothing in the role's list is judged per person (an approval
        with a decision, groups or no self-approval), else once per person."""
        role = person.role
        per_person = batch.get(
            ("badge-per-person", role),
            lambda: inbox_for_user(user=role).filter(judged_per_person_q()).exists(),
        )
        who: Person | Role = person if per_person else role
        key = ("badge", person.pk) if per_person else ("badge", role)
        count = batch.get(key, lambda: inbox_for_user(user=who).count())
        if count == self.badge and not force:
            return ""
        self.badge = count
        return batch.get(
            ("badge-html", count, batch.language),
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
        return self.render_badge(request, person, batch)


class RunConsumer(LiveConsumer):
    """One run's page: status, header, attempts, timeline, checkpoints and result (alike
    for everyone), the user's controls and pending card (when they change), the badge;
    the side-effect report is fetched again when the ledger moved."""

    seq: int | None = None
    controls: tuple[str, Any] | None = None
    checkpoints: str | None = None
    waiting_sent: str | None = None

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
        return self.run_id in change.run_ids or bool(change.request_run_ids) or change.waiting

    def render(
        self, request: HttpRequest, person: Person, change: Change | None, batch: Batch
    ) -> str:
        parts = []
        if change is None or self.run_id in change.run_ids:
            parts.append(self._render_run(request, person, batch, first=change is None))
        elif change.waiting:
            # A worker came or went, or the agent's gate moved: no event of this run says
            # so, but why it waits may have changed.
            parts.append(self._render_waiting(request, batch))
        if change is None or change.request_run_ids:
            parts.append(self.render_badge(request, person, batch, force=change is None))
        return "".join(parts)

    def _render_run(
        self, request: HttpRequest, person: Person, batch: Batch, *, first: bool
    ) -> str:
        role = person.role
        run = batch.get(("run", self.run_id), lambda: Run.objects.filter(pk=self.run_id).first())
        if run is None:
            return ""
        known = self.seq
        if known is None and self.token().isdigit():
            known = int(self.token())
        blockers = batch.get(("blockers", run.id), lambda: run_retry_blockers(run))
        pending = batch.get(("pending", run.id), lambda: _pending_request(run))
        # What the controls offer, and the pending card's state: an approval's decisions
        # change its card (1 of 2 approvals) without changing the run's status.
        # An approval its policy judges per person (a decision was recorded, groups, no
        # self-approval) is rendered for this person: what they may do, and why not.
        # Everything else once per role.
        who: Person | Role = person if pending is not None and judged_per_person(pending) else role
        key: Any = (person.pk, role) if who is person else role
        # What the controls offer, and the pending card's state (an approval's decisions
        # change its card, 1 of 2 approvals, without changing the run's status), and for
        # whom: a person who lost or gained a permission gets their part again.
        controls = (run_controls_state(run, blockers) + _card_state(pending), key)
        if known is not None and run.last_event_seq <= known:
            self.seq = max(known, run.last_event_seq)
            if self.controls is None:
                self.controls = controls  # the page was rendered with these
            return ""
        language, zone = batch.language, batch.zone
        shared = batch.get(
            ("shared-context", run.id), lambda: run_shared_context(run, timeline=None)
        )
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
        checkpoints = f"{len(shared['checkpoints'])}-{run.latest_checkpoint_id}"
        if first or checkpoints != self.checkpoints:
            parts.append(
                batch.get(
                    ("checkpoints", run.id, language, zone),
                    lambda: render_to_string(
                        "dashboard/run_detail.html#run-live-checkpoints",
                        shared,
                        role_request(request),
                    ),
                )
            )
            self.checkpoints = checkpoints
        # The timeline's new rows only, and the last few the page should have already
        # (it keeps those it has, by id: a reply drawn just before this push's events
        # cannot leave a gap). Rows past TIMELINE_LIMIT new ones are not sent.
        after = max(known - TIMELINE_OVERLAP, 0) if known is not None else None
        parts.append(
            batch.get(
                ("events", run.id, after, language, zone),
                lambda: render_to_string(
                    "dashboard/run_detail.html#run-live-events",
                    {"run": run, "timeline": timeline_rows(run, "", after=after)},
                    role_request(request),
                ),
            )
        )
        if first or controls != self.controls:
            # The run's requests and checkpoints: read once for every role.
            requests = batch.get(("requests", run.id), lambda: run_requests_with(run, pending))
            for_who = batch.get(
                ("user", run.id, key, language, zone),
                lambda: _render_run_for(request, who, run, shared, blockers, requests),
            )
            parts.append(personalize(for_who, request))
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
        self.waiting_sent = None
        return "".join(parts)

    def _render_waiting(self, request: HttpRequest, batch: Batch) -> str:
        run = batch.get(("run", self.run_id), lambda: Run.objects.filter(pk=self.run_id).first())
        if run is None or (run.status not in WAITS_FOR_WORKER and self.waiting_sent == ""):
            return ""
        language, zone = batch.language, batch.zone
        html = batch.get(
            ("waiting", run.id, language, zone),
            lambda: render_to_string(
                "dashboard/run_detail.html#run-waiting",
                {**run_waiting_context(run), "oob": True},
                role_request(request),
            ),
        )
        if html == self.waiting_sent:
            return ""
        self.waiting_sent = html if run.status in WAITS_FOR_WORKER else ""
        return html


def _pending_request(run: Run) -> InputRequest | None:
    if not run.pending_request_id:
        return None
    return (
        InputRequest.objects.select_related("run", "answered_by")
        .filter(pk=run.pending_request_id)
        .first()
    )


def _card_state(request: InputRequest | None) -> str:
    """What of the pending request changes its card: its status, and an approval's round
    and decisions."""
    if request is None:
        return ""
    return f":{request.id}:{request.status}:{request.edit_round}:{request.decisions}"


def _render_run_for(
    request: HttpRequest,
    who: Person | Role,
    run: Run,
    shared: dict[str, Any],
    blockers: list[str],
    requests: RunRequests,
) -> str:
    """The run page's controls and question card as ``who`` sees them (a role, or one
    person when the card is theirs alone), with marks where each socket puts its own CSRF
    token and idempotency keys (``personalize``)."""
    neutral = role_request(request)
    context = run_context(
        neutral, run, who=who, shared=shared, retry_blockers=blockers, requests=requests
    )
    context["csrf_token"] = personal("csrf")
    context["cancel_key"], context["retry_key"] = personal("key0"), personal("key1")
    # The pause panel's forms too (``pause_context`` drew keys once for the whole role).
    context["pause_key"], context["continue_key"] = personal("key4"), personal("key5")
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
        user = person
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
            return self._counts(request, person, batch, force=True)
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
        html.append(self._counts(request, person, batch))
        return "".join(html)

    def _keep(self, user: Person) -> list[str]:
        """Cards on the page whose request left the list: keep the ones a person should
        see as they are now (expired, closed with the run, answered by this user; and
        under Needs me one still pending that is no longer theirs to act on: they approved
        it, one of several, and the card says so)."""
        if not self.shown or self.tab not in ("needs", "all"):
            return []
        rows = list(
            InputRequest.objects.filter(pk__in=self.shown).values_list(
                "id", "status", "answered_by"
            )
        )
        keep = [
            req_id
            for req_id, status, answered_by in rows
            if status != RequestStatus.PENDING
            and (status != RequestStatus.ANSWERED or answered_by == user.pk)
        ]
        pending = [req_id for req_id, status, _by in rows if status == RequestStatus.PENDING]
        if pending and self.tab == "needs":
            # Still pending but no longer this person's to act on (not merely pushed past
            # the page by more urgent ones): the same query as the list says which.
            still = set(
                inbox_for_user(user=user).filter(pk__in=pending).values_list("id", flat=True)
            )
            keep += [req_id for req_id in pending if req_id not in still]
        return keep

    def _render_list(
        self, request: HttpRequest, person: Person, batch: Batch, requests: list[InputRequest]
    ) -> str:
        context = inbox_context(person, self.tab, requests=requests)
        context["oob"] = True
        self.versions = {card.req.id: card.version for card in context["cards"]}
        self.shown = list(self.versions)
        html = render_to_string("dashboard/inbox.html#inbox-list", context, request=request)
        return html + self._counts(request, person, batch, force=True)

    def _counts(
        self, request: HttpRequest, person: Person, batch: Batch, *, force: bool = False
    ) -> str:
        badge = self.render_badge(request, person, batch, force=force)
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
        return bool(change.run_ids) or change.waiting

    def render(
        self, request: HttpRequest, person: Person, change: Change | None, batch: Batch
    ) -> str:
        query = self.scope.get("query_string", b"")
        key = ("runs", query, batch.language, batch.zone)
        context = batch.get(key, lambda: run_list_context(person, self.params))
        ids = [row["run"].id for row in context["rows"]]
        token = context["live_token"]
        badge = ""
        if change is None or change.request_run_ids:
            badge = self.render_badge(request, person, batch, force=change is None)
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
                if change is None
                or row["run"].id in change.run_ids
                or (change.waiting and row["waiting"] is not None)
            ]
            tabs = render_to_string("dashboard/run_list.html#runs-tabs", context, request)
            # Rows first: htmx parses a fragment in a <template>, where a <tr> after another
            # element (the tabs' <nav>) is dropped, while elements after the rows are kept.
            html = "".join(changed) + tabs
        self.shown, self.token_seen = ids, token
        return html + badge


class WorkersConsumer(LiveConsumer):
    """The Workers page: the table again when a worker's presence changed (one appeared,
    went stale or gone, came back) or a run changed (what each runs now, its losses), and
    only when what it shows changed. Needs ``runs.view_worker``, checked at every render."""

    requires_view = False
    token_seen = ""

    def may_connect(self, user: Any) -> bool:
        return bool(user.has_perm(VIEW_WORKERS))

    def concerned(self, change: Change) -> bool:
        return bool(change.worker_ids or change.run_ids or change.request_run_ids)

    def render(
        self, request: HttpRequest, person: Person, change: Change | None, batch: Batch
    ) -> str:
        if not person.has_perm(VIEW_WORKERS):
            return ""
        badge = ""
        if change is None or change.request_run_ids:
            badge = self.render_badge(request, person, batch, force=change is None)
        key = ("workers", batch.language, batch.zone)
        context = batch.get(key, workers_context)
        token = context["live_token"]
        if not self.token_seen:
            self.token_seen = self.token()
        if token == self.token_seen:
            return badge
        self.token_seen = token
        html = render_to_string(
            "dashboard/workers.html#workers-live", {**context, "oob": True}, request
        )
        return html + badge
