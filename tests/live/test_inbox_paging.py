"""The live inbox with pages: the socket keeps the first page and its "Show more" current,
and the counts say how many wait in all."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from dashboard.pages.inbox import PAGE
from tests.dashboard.support import more_pending
from tests.live.conftest import db, pushed, run, session_cookie, socket
from tests.live.test_consumers import inbox_url
from tests.runs.factory import interrupted

pytestmark = pytest.mark.django_db(transaction=True)

CARD = re.compile(r'<article class="card request-card[^"]*" id="request-(req_[^"]+)"')


def test_it_keeps_the_first_page_and_its_show_more_current(operator: User) -> None:
    _run, _lease, _cp, first = interrupted(expires_in=600)
    more_pending(first, PAGE - 2, first_in=1200)

    async def scenario() -> None:
        inbox = socket(await db(inbox_url)(operator), cookie=await db(session_cookie)(operator))
        assert (await inbox.connect())[0]
        assert len(await pushed(inbox)) == 1  # the badge: the page is current

        # The request that fills the page brings "Show more" with it.
        _r, _l, _c, last = await db(interrupted)(expires_in=20_000)
        got = "".join(await pushed(inbox))
        assert 'id="inbox-list"' in got and ">Show more</a>" in got
        # (last asks what first asks: the inbox groups it with first, so it is not last.)
        assert last.id in CARD.findall(got) and len(CARD.findall(got)) == PAGE
        assert re.search(r'id="inbox-count"[^>]*>25<', got)

        # One past the full page: the page stays as it is, the counts say 26 wait.
        _r, _l, _c, beyond = await db(interrupted)(expires_in=30_000)
        got = "".join(await pushed(inbox))
        assert 'id="inbox-list"' not in got and f"request-{beyond.id}" not in got
        assert re.search(r'id="inbox-count"[^>]*>26<', got)
        assert re.search(r'id="inbox-tab-count"[^>]*>26<', got)

        # One more urgent than all heads the page; the last one moves past it.
        _r, _l, _c, urgent = await db(interrupted)(expires_in=60)
        got = "".join(await pushed(inbox))
        assert CARD.findall(got)[0] == urgent.id and len(CARD.findall(got)) == PAGE
        assert f"request-{last.id}" not in got and ">Show more</a>" in got
        assert re.search(r'id="inbox-count"[^>]*>27<', got)
        await inbox.disconnect()

    run(scenario)
