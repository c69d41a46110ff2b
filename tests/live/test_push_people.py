"""Issue 27: a push is rendered once per distinct thing to render, and still each person
sees exactly their own part.

Through a real uvicorn process (its own live hub, reading the test database) and real
websocket clients; the changes are committed here and reach it through the Redis channel
layer, as a worker's do. Two people of different roles on one run get different parts of
the same push; a person removed from their group gets the reduced part at the next push;
what is one person's own (their CSRF token, their idempotency keys, the self-approval
refusal) never reaches another's frame.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connection
from django.middleware.csrf import _unmask_cipher_token

from runs import services
from runs.approvals import parse_policy
from runs.models import AgentApprovalPolicy, Run
from tests.live.conftest import db, run, session_cookie
from tests.live.server import free_port
from tests.live.test_approval_cards import ACTION, approve_button, card_in, person
from tests.runs.factory import AGENT, claim, epochs, interrupted, start
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not os.environ.get("REDIS_URL") or not os.environ.get("DATABASE_URL"),
        reason="a server in another process needs PostgreSQL and Redis",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"


@pytest.fixture
def server(transactional_db: Any) -> Iterator[str]:
    """uvicorn serving ``config.asgi`` on the test database and this process's channel
    prefix; its base URL."""
    url = urlsplit(os.environ["DATABASE_URL"])
    database = urlunsplit(url._replace(path="/" + str(connection.settings_dict["NAME"])))
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database,
        "DATABASE_POOL_SIZE": "4",
        "CHANNEL_PREFIX": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
        "ALLOWED_HOSTS": f"{HOST},localhost",
    }
    command = [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", HOST]
    command += ["--port", str(port), "--workers", "1", "--lifespan", "off"]
    command += ["--no-access-log", "--log-level", "warning"]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
    )
    base = f"http://{HOST}:{port}"
    try:
        wait_for(lambda: _answers(base + "/healthz"), 30, "uvicorn to answer")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


class Page:
    """One browser's run page over a real websocket: what it was sent."""

    def __init__(self, base: str, target: Run, cookie: str) -> None:
        target.refresh_from_db()
        self.url = (
            base.replace("http://", "ws://") + f"/ws/runs/{target.id}/?v={target.last_event_seq}"
        )
        self.base = base
        self.cookie = cookie
        self.csrf_secret = _cookie(cookie, "csrftoken")

    async def open(self) -> None:
        import websockets

        self.ws = await websockets.connect(
            self.url, additional_headers=[("Origin", self.base), ("Cookie", self.cookie)]
        )
        await self.frame()  # the snapshot (the badge)

    async def frame(self, within: float = 15.0) -> str:
        text = await asyncio.wait_for(self.ws.recv(), within)
        assert isinstance(text, str)
        return text

    async def close(self) -> None:
        await self.ws.close()


def _cookie(cookie: str, name: str) -> str:
    for pair in cookie.split("; "):
        key, _, value = pair.partition("=")
        if key == name:
            return value
    return ""


def with_csrf(user: User) -> str:
    """A signed-in browser's cookies: its session and a CSRF cookie of its own."""
    from django.middleware.csrf import _get_new_csrf_string

    cookie = session_cookie(user)
    if not _cookie(cookie, "csrftoken"):
        cookie += f"; csrftoken={_get_new_csrf_string()}"
    return cookie


def hidden(html: str, name: str) -> list[str]:
    return re.findall(rf'name="{name}" value="([^"]*)"', html)


def ask(lease: Any, cp: Any) -> None:
    services.attempt_interrupt(
        **epochs(lease),
        checkpoint_id=cp.id,
        kind="input_required",
        prompt="Which versions?",
        accepted_schema={"versions": "string[]"},
        expires_in=600,
    )


def test_two_roles_on_one_run_get_their_own_parts_of_one_push(server: str) -> None:
    olivia = person("olivia", "operator")
    otto = person("otto", "operator")
    victor = person("victor", "viewer")
    target = start()
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="ask", state={})
    pages = {
        user.username: Page(server, target, with_csrf(user)) for user in (olivia, otto, victor)
    }

    async def scenario() -> dict[str, str]:
        for page in pages.values():
            await page.open()
        await db(lambda: ask(lease, cp))()
        frames = {name: await page.frame() for name, page in pages.items()}
        for page in pages.values():
            await page.close()
        return frames

    frames = run(scenario)
    for name, html in frames.items():
        assert "Which versions?" in html, name
        assert f'id="run-{target.id}-controls"' in html, name
        # The timeline's new rows are appended to the page's own list.
        assert f'hx-swap-oob="beforeend:#run-{target.id}-events"' in html, name
        assert f'id="run-{target.id}-event-' in html, name
    operator, viewer = frames["olivia"], frames["victor"]
    assert f'action="/runs/{target.id}/cancel"' in operator
    assert "Only operators can cancel runs." not in operator
    assert f'action="/runs/{target.id}/cancel"' not in viewer
    assert "Only operators can cancel runs." in viewer
    # Each page's CSRF tokens are its own cookie's, and its keys its own.
    for name, html in frames.items():
        tokens = hidden(html, "csrfmiddlewaretoken")
        assert tokens, name
        assert {_unmask_cipher_token(t) for t in tokens} == {pages[name].csrf_secret}, name
    # Every form's idempotency key is new on every page, as on a rendered page: two
    # people of one role (whose part is rendered once) never share one.
    keys = {name: hidden(html, "idempotency_key") for name, html in frames.items()}
    assert len(keys["olivia"]) >= 2  # cancel, answer
    assert len(set(keys["olivia"])) == len(keys["olivia"])
    assert not set(keys["olivia"]) & set(keys["otto"])
    assert not set(keys["olivia"]) & set(keys["victor"])
    assert pages["olivia"].csrf_secret not in viewer and pages["victor"].csrf_secret not in operator


def test_two_people_of_one_role_never_share_a_forms_idempotency_key(server: str) -> None:
    olivia = person("olivia", "operator")
    otto = person("otto", "operator")
    target = start()
    lease = claim()
    pages = {user.username: Page(server, target, with_csrf(user)) for user in (olivia, otto)}

    async def scenario() -> dict[str, str]:
        for page in pages.values():
            await page.open()

        def both_approvers() -> None:
            for user in (olivia, otto):
                user.groups.add(Group.objects.get(name="approver"))

        # Both change role alike: the next push draws their part once, for that role.
        await db(both_approvers)()
        await db(lambda: services.attempt_log(**epochs(lease), message="one"))()
        frames = {name: await page.frame() for name, page in pages.items()}
        for page in pages.values():
            await page.close()
        return frames

    frames = run(scenario)
    keys = {name: hidden(html, "idempotency_key") for name, html in frames.items()}
    for name, html in frames.items():
        assert f'action="/runs/{target.id}/pause"' in html, name
        assert len(keys[name]) == 2, name  # cancel, pause
        assert len(set(keys[name])) == len(keys[name]), name
    assert not set(keys["olivia"]) & set(keys["otto"])


def test_a_person_removed_from_their_group_gets_the_reduced_part_at_the_next_push(
    server: str,
) -> None:
    olivia = person("olivia", "operator", "viewer")
    otto = person("otto", "operator")
    target = start()
    lease = claim()
    services.checkpoint_save(**epochs(lease), step="ask", state={})
    pages = {user.username: Page(server, target, with_csrf(user)) for user in (olivia, otto)}

    async def scenario() -> tuple[str, str, str]:
        for page in pages.values():
            await page.open()
        await db(lambda: services.attempt_log(**epochs(lease), message="one"))()
        before = await pages["olivia"].frame()
        await pages["otto"].frame()
        await db(lambda: olivia.groups.remove(Group.objects.get(name="operator")))()
        # Nothing of the run's controls changed: only who she is.
        await db(lambda: services.attempt_log(**epochs(lease), message="two"))()
        after = await pages["olivia"].frame()
        other = await pages["otto"].frame()
        for page in pages.values():
            await page.close()
        return before, after, other

    before, after, other = run(scenario)
    cancel = f'action="/runs/{target.id}/cancel"'
    # The first log line changed nothing of the controls: they were not sent again.
    assert f'id="run-{target.id}-controls"' not in before
    assert f'id="run-{target.id}-controls"' in after
    assert cancel not in after and "Only operators can cancel runs." in after
    assert "two" in after
    # Otto, still an operator, is not sent his part again: it did not change for him.
    assert "two" in other and f'id="run-{target.id}-controls"' not in other


def test_a_person_removed_from_every_group_that_may_view_is_closed_at_the_next_push(
    server: str,
) -> None:
    victor = person("victor", "viewer")
    target = start()
    lease = claim()
    page = Page(server, target, with_csrf(victor))

    async def scenario() -> Any:
        import websockets

        await page.open()
        await db(lambda: victor.groups.clear())()
        await db(lambda: services.attempt_log(**epochs(lease), message="unseen"))()
        try:
            frame = await page.frame()
        except websockets.ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else None
        return frame

    assert run(scenario) == 4403


def test_the_self_approval_refusal_reaches_only_the_person_it_is_about(server: str) -> None:
    alice = person("alice", "approver")
    bob = person("bob", "approver")
    sam = person("sam", "operator", "approver")
    AgentApprovalPolicy.objects.create(
        agent=AGENT, policy=parse_policy({"required": 2, "self_approval": False})
    )
    target, _lease, _cp, req = interrupted(kind="auth_required", action=ACTION, started_by=sam)
    pages = {user.username: Page(server, target, with_csrf(user)) for user in (bob, sam)}

    async def scenario() -> dict[str, str]:
        for page in pages.values():
            await page.open()
        await db(
            lambda: services.run_resume(
                run_id=target.id,
                request_id=req.id,
                checkpoint_id=req.checkpoint_id,
                value={"decision": "approve", "comment": "checked"},
                user=alice,
            )
        )()
        frames = {name: await page.frame() for name, page in pages.items()}
        for page in pages.values():
            await page.close()
        return frames

    frames = run(scenario)
    refusal = "You started this run or answered its last question"
    sam_card, bob_card = card_in([frames["sam"]], req.id), card_in([frames["bob"]], req.id)
    assert "1 of 2 approvals" in sam_card and "1 of 2 approvals" in bob_card
    assert refusal in sam_card and "disabled" in approve_button(sam_card)
    assert refusal not in frames["bob"]
    assert approve_button(bob_card) and "disabled" not in approve_button(bob_card)
    for name, html in frames.items():
        tokens = hidden(html, "csrfmiddlewaretoken")
        assert {_unmask_cipher_token(t) for t in tokens} == {pages[name].csrf_secret}, name
