"""The inbox's list: its tabs, a page of requests in each tab's order, their cards grouped,
and the token that names what a rendered list shows (the page and its live socket share
them)."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.db.models import Q, QuerySet
from django.utils.translation import gettext_lazy

from dashboard.actions import encode_cursor
from dashboard.pages.cards import RequestCard, build_card
from runs.access import Actor
from runs.models import InputRequest
from runs.selectors import VIEW, inbox_for_user
from runs.states import RequestStatus

TABS = [
    ("needs", gettext_lazy("Needs me")),
    ("all", gettext_lazy("All pending")),
    ("answered", gettext_lazy("Answered")),
    ("expired", gettext_lazy("Expired")),
]
# Cards per page. Each card is a form, and rendering them was most of the page's time
# (bench/growth.py: ~100-250 ms for 100 cards); the rest come with "Show more".
PAGE = 25


def _tab_requests(
    user: Actor, tab: str, cursor: tuple[dt.datetime, str] | None = None
) -> QuerySet[InputRequest]:
    """The tab's requests in its order, after ``cursor`` (the sort key of a card shown last)."""
    if tab in ("needs", "all"):
        requests = inbox_for_user(user=user, mine_only=tab == "needs")
        if cursor is not None:
            # The range on expires_at alone lets the scan of request_pending_expiry_idx start
            # at the cursor and stay in order; the OR only breaks ties.
            when, after_id = cursor
            requests = requests.filter(expires_at__gte=when).filter(
                Q(expires_at__gt=when) | Q(id__gt=after_id)
            )
        return requests
    if not user.has_perm(VIEW):
        return InputRequest.objects.none()
    closed = InputRequest.objects.select_related("run", "answered_by")
    if tab == "answered":
        closed = closed.filter(status=RequestStatus.ANSWERED).order_by("-answered_at", "-id")
        if cursor is not None:
            when, after_id = cursor
            closed = closed.filter(answered_at__lte=when).filter(
                Q(answered_at__lt=when) | Q(id__lt=after_id)
            )
        return closed
    closed = closed.filter(status__in=[RequestStatus.EXPIRED, RequestStatus.CANCELLED]).order_by(
        "-closed_at", "-id"
    )
    if cursor is not None:
        when, after_id = cursor
        closed = closed.filter(closed_at__lte=when).filter(
            Q(closed_at__lt=when) | Q(id__lt=after_id)
        )
    return closed


def _sort_key(req: InputRequest, tab: str) -> dt.datetime | None:
    """What ``tab`` orders by (and so what its cursor holds)."""
    if tab == "answered":
        return req.answered_at
    if tab == "expired":
        return req.closed_at
    return req.expires_at


def inbox_requests(
    user: Actor,
    tab: str,
    *,
    keep: Iterable[str] = (),
    cursor: tuple[dt.datetime, str] | None = None,
) -> list[InputRequest]:
    """The requests the inbox lists on ``tab``, in its order: a page of them.

    ``keep``: requests a live page already shows that have left the list since (expired,
    closed, or answered by this user); they stay in their place, read-only, so a person
    sees what became of them (``live.consumers``).
    """
    requests = list(_tab_requests(user, tab, cursor)[:PAGE])
    listed = {r.id for r in requests}
    extra = [k for k in keep if k not in listed]
    if extra:
        requests += InputRequest.objects.select_related("run", "answered_by").filter(pk__in=extra)
        requests.sort(key=lambda r: (r.expires_at, r.id))
    return requests


def _last_listed(tab: str, requests: list[InputRequest]) -> InputRequest | None:
    """The last request of a full page (its cursor opens the next), or None when the page
    is not full. On the pending tabs the kept requests (closed by now) do not count.

    A full page always offers "Show more", even when nothing follows (which the next page
    then says): the live socket re-renders the list only when the page's own requests
    change, so a page that knew of one more would miss the one that arrives past it.
    """
    if tab in ("needs", "all"):
        listed = [r for r in requests if r.status == RequestStatus.PENDING]
    else:
        listed = requests
    return listed[-1] if len(listed) >= PAGE else None


@dataclass
class InboxGroup:
    """Pending questions of one agent that read the same (kind and title): one line."""

    key: tuple[str, ...]
    cards: list[RequestCard]

    @property
    def title(self) -> str:
        return self.cards[0].title

    @property
    def agent(self) -> str:
        return str(self.cards[0].run.agent)

    @property
    def soonest(self) -> dt.datetime:
        return min(c.req.expires_at for c in self.cards)

    @property
    def expanded(self) -> bool:
        return any(c.expanded for c in self.cards)


def group_cards(cards: list[RequestCard]) -> list[InboxGroup]:
    """Identical pending questions of one agent together, at the place of the most urgent
    (the list is in urgency order already); everything else stays a row of its own."""
    groups: list[InboxGroup] = []
    by_key: dict[tuple[str, ...], InboxGroup] = {}
    for card in cards:
        if card.is_open and not card.broken:
            key: tuple[str, ...] = (str(card.run.agent), str(card.req.kind), card.title)
        else:
            key = ("one", card.req.id)
        if key in by_key:
            by_key[key].cards.append(card)
        else:
            by_key[key] = InboxGroup(key=key, cards=[card])
            groups.append(by_key[key])
    return groups


def inbox_context(
    user: Actor,
    tab: str,
    *,
    replace: RequestCard | None = None,
    requests: list[InputRequest] | None = None,
    cursor: tuple[dt.datetime, str] | None = None,
) -> dict[str, Any]:
    """The inbox page's context (the page and its live socket share it).

    ``replace`` puts a card already built (a form with its errors) in its request's place.
    ``cursor``: the page after the card with that sort key (a live socket shows the first).
    """
    if requests is None:
        requests = inbox_requests(user, tab, cursor=cursor)
    cards = []
    for req in requests:
        if replace is not None and req.id == replace.req.id:
            cards.append(replace)
        else:
            cards.append(build_card(req, user=user, origin="inbox"))
    if replace is not None and all(c.req.id != replace.req.id for c in cards):
        cards.insert(0, replace)
    if replace is not None:
        replace.expanded = True
    elif cursor is None and tab in ("needs", "all"):
        # The most urgent request the person can act on now opens at once: a question
        # they may answer, an approval they may approve (docs/dashboard.md). A link to a
        # card (#request-…) opens that one instead (app.js).
        first = next((c for c in cards if c.actionable), None)
        if first is not None:
            first.expanded = True
    token = inbox_token((card.req.id, card.version) for card in cards)
    next_url = ""
    last = _last_listed(tab, requests)
    when = _sort_key(last, tab) if last is not None else None
    if last is not None and when is not None:
        next_url = "?" + urlencode({"tab": tab, "cursor": encode_cursor(when, last.id)})
    return {
        "tab": tab,
        "tabs": TABS,
        "cards": cards,
        "groups": group_cards(cards),
        "live_token": token,
        "next_url": next_url,
        "first_url": "?" + urlencode({"tab": tab}) if cursor is not None else "",
    }


def inbox_token(versions: Iterable[tuple[str, str]]) -> str:
    """Names what a rendered inbox list shows (its cards' ids and versions, in order); its
    live socket sends nothing the page already has."""
    shown = "|".join(f"{req_id}:{version}" for req_id, version in versions)
    return hashlib.sha256(shown.encode()).hexdigest()[:16]
