"""The inbox a page at a time: the most urgent cards first, "Show more" for the rest (htmx
puts them under the others; without JavaScript it opens the next page), the total count."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboard.pages.inbox import PAGE
from runs.models import InputRequest
from tests.dashboard.support import HTMX, more_pending
from tests.runs.factory import interrupted

pytestmark = pytest.mark.django_db

CARD = re.compile(r'<article class="card request-card[^"]*" id="request-(req_[^"]+)"')


def card_ids(html: str) -> list[str]:
    return CARD.findall(html)


def show_more_url(html: str) -> str:
    match = re.search(r'<a class="btn btn-secondary" href="([^"]+)" hx-get="\1"', html)
    assert match, "no Show more control"
    return "/" + match.group(1).replace("&amp;", "&")


def pending_in_order(**filters: object) -> list[str]:
    return list(
        InputRequest.objects.filter(status="pending", **filters)
        .order_by("expires_at", "id")
        .values_list("id", flat=True)
    )


@pytest.fixture
def thirty(db: None) -> list[str]:
    """30 pending requests, the soonest to expire asked last (the order is by expiry)."""
    _run, _lease, _cp, req = interrupted(expires_in=3600 * 5)
    more_pending(req, 29, first_in=600)
    return pending_in_order()


def test_it_shows_the_most_urgent_page_first_and_counts_every_pending_request(
    client: Client, operator: User, thirty: list[str]
) -> None:
    client.force_login(operator)
    html = client.get("/").content.decode()
    assert card_ids(html) == thirty[:PAGE] and PAGE == 25
    # The badge and the tab count say how many wait in all, not how many are on the page.
    assert 'aria-label="30 waiting">30</span>' in html
    assert '<span id="inbox-tab-count" class="tab-count">30</span>' in html
    assert ">Show more</a>" in html
    # The first page keeps the live inbox socket.
    assert 'ws-connect="/ws/inbox/?tab=needs&amp;v=' in html


def test_it_opens_the_next_page_without_javascript(
    client: Client, operator: User, thirty: list[str]
) -> None:
    client.force_login(operator)
    html = client.get(show_more_url(client.get("/").content.decode())).content.decode()
    assert card_ids(html) == thirty[PAGE:]
    assert ">Show more</a>" not in html
    assert '<a class="btn btn-ghost" href="?tab=needs">← First page</a>' in html
    assert 'aria-label="30 waiting">30</span>' in html
    # Its socket keeps the badge current; the inbox socket would put the first page here.
    assert 'ws-connect="/ws/live/?v=30"' in html
    assert "/ws/inbox/" not in html


def test_it_appends_the_next_cards_in_place_of_the_control_for_htmx(
    client: Client, operator: User, thirty: list[str]
) -> None:
    client.force_login(operator)
    url = show_more_url(client.get("/").content.decode())
    reply = client.get(url, HTTP_HX_TARGET="inbox-more", **HTMX)
    html = reply.content.decode()
    assert reply.status_code == 200
    assert "<html" not in html and 'id="inbox-list"' not in html
    assert card_ids(html) == thirty[PAGE:]
    # The new control comes last; it names the first new card (focus goes there) and what
    # the status region announces.
    assert html.rstrip().endswith("</div>")
    assert html.index('id="inbox-more"') > html.index(f'id="request-{thirty[-1]}"')
    assert f'data-first="request-{thirty[PAGE]}"' in html
    assert 'data-announce="5 more requests shown. No more requests."' in html
    assert ">Show more</a>" not in html and "First page" not in html


def test_it_walks_every_page_once_even_when_expiries_tie(client: Client, operator: User) -> None:
    _run, _lease, _cp, req = interrupted(expires_in=60)
    more_pending(req, 60, first_in=600, step=0)  # one expiry for 60 requests: ids break ties
    expected = pending_in_order()
    client.force_login(operator)
    seen: list[str] = []
    html = client.get("/").content.decode()
    while True:
        seen += card_ids(html)
        if ">Show more</a>" not in html:
            break
        html = client.get(show_more_url(html), HTTP_HX_TARGET="inbox-more", **HTMX).content.decode()
    assert seen == expected and len(seen) == 61


def test_it_offers_more_after_a_full_page_only(client: Client, operator: User) -> None:
    _run, _lease, _cp, req = interrupted(expires_in=60)
    more_pending(req, PAGE - 2)
    client.force_login(operator)
    html = client.get("/").content.decode()
    assert len(card_ids(html)) == PAGE - 1
    assert ">Show more</a>" not in html and "First page" not in html
    # A full page offers more without counting what follows (a live page could not keep
    # that count); when nothing follows, the next page says so.
    more_pending(req, 1, first_in=90_000)
    html = client.get("/").content.decode()
    assert len(card_ids(html)) == PAGE and ">Show more</a>" in html
    reply = client.get(show_more_url(html), HTTP_HX_TARGET="inbox-more", **HTMX)
    assert card_ids(reply.content.decode()) == []
    assert 'data-announce="No more requests."' in reply.content.decode()


def test_it_shows_the_first_page_for_a_garbled_cursor(
    client: Client, operator: User, thirty: list[str]
) -> None:
    client.force_login(operator)
    for cursor in ("%%%", "bm90LWEtZGF0ZXxyZXFfeA", "MjAyNi0xMy00MFQwMDowMDowMCswMDowMHxyZXFfeA"):
        html = client.get(f"/?tab=needs&cursor={cursor}").content.decode()
        assert card_ids(html) == thirty[:PAGE]


def test_it_says_so_when_a_later_page_has_emptied(
    client: Client, operator: User, thirty: list[str]
) -> None:
    client.force_login(operator)
    url = show_more_url(client.get("/").content.decode())
    InputRequest.objects.filter(pk__in=thirty[PAGE:]).update(
        status="expired", closed_at=timezone.now()
    )
    html = client.get(url).content.decode()
    assert card_ids(html) == []
    assert "No more requests." in html and "Nothing needs you right now." not in html
    assert "← First page" in html


def test_it_pages_the_all_pending_tab_for_a_viewer(
    client: Client, viewer: User, thirty: list[str]
) -> None:
    client.force_login(viewer)
    html = client.get("/?tab=all").content.decode()
    assert card_ids(html) == thirty[:PAGE]
    url = show_more_url(html)
    assert "tab=all" in url
    assert card_ids(client.get(url).content.decode()) == thirty[PAGE:]


def test_it_pages_the_answered_tab_latest_first(
    client: Client, operator: User, thirty: list[str]
) -> None:
    start = timezone.now() - dt.timedelta(hours=1)
    for i, req_id in enumerate(thirty):
        InputRequest.objects.filter(pk=req_id).update(
            status="answered", answered_at=start + dt.timedelta(minutes=i % 7), answer={}
        )
    expected = list(
        InputRequest.objects.order_by("-answered_at", "-id").values_list("id", flat=True)
    )
    client.force_login(operator)
    html = client.get("/?tab=answered").content.decode()
    assert card_ids(html) == expected[:PAGE]
    assert card_ids(client.get(show_more_url(html)).content.decode()) == expected[PAGE:]


def test_it_keeps_the_empty_state_with_nothing_pending(client: Client, operator: User) -> None:
    client.force_login(operator)
    html = client.get("/").content.decode()
    assert "Nothing needs you right now." in html
    assert ">Show more</a>" not in html and "No more requests." not in html


def test_it_reads_the_same_number_of_statements_however_many_wait(
    client: Client, operator: User
) -> None:
    _run, _lease, _cp, req = interrupted(expires_in=60)
    more_pending(req, 29)
    client.force_login(operator)
    client.get("/")  # sessions, permissions and the like warm up alike for both counts

    def statements() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/").status_code == 200
        return len(queries)

    at_30 = statements()
    more_pending(req, 30, first_in=20_000)
    assert InputRequest.objects.filter(status="pending").count() == 60
    assert statements() == at_30
