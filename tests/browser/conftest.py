"""Browser tests: Playwright driving Debian's Chromium against a live ASGI server (daphne in a
thread of the test process, ``tests.live.server``: pages and their live websockets).

Without ``/usr/bin/chromium`` the tests skip and say so; in CI (``CI=true``) they fail
instead, so a missing browser can never turn into a green run. Playwright's sync API
runs an event loop in this thread, and the tests also use the ORM here, hence
``DJANGO_ALLOW_ASYNC_UNSAFE``. Screenshots go to ``test-output/screenshots/``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.live.server import wait_until_no_loop_receives

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-output" / "screenshots"
ZONE = "Asia/Shanghai"


@pytest.fixture(autouse=True)
def _permissions_and_groups(transactional_db: None) -> None:
    """Make sure the content types, permissions and groups that migrations create exist.

    A transactional test with ``serialized_rollback`` flushes them at teardown and
    Django then skips ``post_migrate``, expecting the next test to restore the
    serialized copy. That restore cannot work here: while Playwright's loop runs in
    this thread, Django hands out a different connection object than the one that
    holds the serialized copy. So recreate them the way ``migrate`` does.
    """
    from django.core.management.sql import emit_post_migrate_signal

    from runs.groups import ensure_default_groups

    emit_post_migrate_signal(verbosity=0, interactive=False, db="default")
    ensure_default_groups()


@pytest.fixture(scope="session")
def live_server() -> Iterator[Any]:
    """daphne (ASGI: pages and the live websockets) instead of pytest-django's WSGI server."""
    from tests.live.server import AsgiLiveServer

    server = AsgiLiveServer().start()
    yield server
    server.stop()


class PageProblems:
    """Console errors and uncaught exceptions (CSP violations are console errors)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def console(self, message: Any) -> None:
        if message.type == "error" and not _expected_error(message.text):
            self.errors.append(f"console: {message.text} at {message.location}")

    def page_error(self, error: Any) -> None:
        self.errors.append(f"pageerror: {error}")


def _expected_error(text: str) -> bool:
    # htmx logs the 4xx replies it swaps on purpose (409 stale, 422 invalid), as the
    # browser does for any failed load; they are the behaviour under test.
    return bool(re.search(r"status of (400|409|422)", text))


# Marks a page when htmx's ws extension has opened its socket (``socket_open``).
SOCKET_MARK = 'document.addEventListener("htmx:wsOpen", function () { window.__wsOpen = true; });'


@pytest.fixture
def new_page(browser: Any, live_server: Any) -> Iterator[Any]:
    """A factory of pages, each in its own browser context (own cookies: own session)."""
    contexts = []
    problems = PageProblems()

    def make(*, javascript: bool = True) -> Any:
        context = browser.new_context(
            base_url=live_server.url,
            viewport={"width": 1280, "height": 900},
            timezone_id=ZONE,
            locale="en-US",
            java_script_enabled=javascript,
        )
        context.set_default_timeout(10_000)
        contexts.append(context)
        # Every page marks when its live socket opens (``socket_open``).
        context.add_init_script(SOCKET_MARK)
        page = context.new_page()
        page.on("console", problems.console)
        page.on("pageerror", problems.page_error)
        return page

    yield make
    for context in contexts:
        context.close()
    # The live server lets go of the pages' sockets before the next test (a live test's
    # scenario cannot receive on the channel layer while the server's loop does).
    wait_until_no_loop_receives()
    assert problems.errors == [], "the browser reported problems"


@pytest.fixture
def page(new_page: Any) -> Any:
    return new_page()


def login(page: Any, username: str) -> None:
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def socket_open(page: Any) -> None:
    """Wait until the page's live socket is open (so the server has joined its groups): a
    change made before that would be pushed to nobody and the page would never show it."""
    page.wait_for_function("() => window.__wsOpen === true")


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def open_request(page: Any, request_id: str) -> Any:
    """The inbox shows each request as a one-line row (issue 15): open the row (and its
    group) of ``request_id`` so its form can be used; return the card. A card shown open
    (the run page, an answered reply) is returned as it is."""
    card = page.locator(f"#request-{request_id}")
    card.wait_for(state="attached")
    group = card.locator("xpath=ancestor::details[contains(@class, 'inbox-group')]")
    if group.count() and group.get_attribute("open") is None:
        group.locator("xpath=./summary").click()
    row = card.locator("xpath=./details[contains(@class, 'row-details')]")
    if row.count() and row.get_attribute("open") is None:
        row.locator("xpath=./summary").click()
    return card
