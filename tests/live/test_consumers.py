"""The live sockets through the real ASGI stack (origin check, session, consumers, channel
layer): who may connect, what a commit pushes, what a rollback pushes, and what a
reconnecting page gets."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, User
from django.contrib.sessions.models import Session
from django.db import transaction

from runs import services
from runs.events import append_event
from runs.metrics import OPEN_WEBSOCKETS
from runs.models import Run
from tests.live.conftest import db, pushed, run, session_cookie, silent, socket
from tests.runs.factory import claim, epochs, interrupted, start

pytestmark = pytest.mark.django_db(transaction=True)


def run_page(run: Run) -> str:
    """The socket URL the run page opens (``v``: the events it was rendered from)."""
    run.refresh_from_db()
    return f"/ws/runs/{run.id}/?v={run.last_event_seq}"


def status_in(html: str, run: Run) -> str | None:
    match = re.search(rf'id="run-{run.id}-status"[^>]*data-status="([a-z_]+)"', html)
    return match.group(1) if match else None


# --- Who may connect -------------------------------------------------------------------------


def test_it_refuses_a_socket_without_a_session(operator: User) -> None:
    async def scenario() -> None:
        for path in ("/ws/inbox/", "/ws/runs/", "/ws/live/", "/ws/runs/run_x/"):
            communicator = socket(path)
            connected, _ = await communicator.connect()
            assert not connected, path
            await communicator.disconnect()

    run(scenario)


def test_it_refuses_a_foreign_origin(operator: User) -> None:
    cookie = session_cookie(operator)

    async def scenario() -> None:
        for origin in ("http://evil.example", None):
            communicator = socket("/ws/inbox/", cookie=cookie, origin=origin)
            connected, _ = await communicator.connect()
            assert not connected, origin
            await communicator.disconnect()
        # The same cookie from our own origin is let in.
        communicator = socket("/ws/inbox/", cookie=cookie)
        connected, _ = await communicator.connect()
        assert connected
        await communicator.disconnect()

    run(scenario)


def test_it_refuses_an_outsider_on_a_run_it_may_not_see(operator: User, outsider: User) -> None:
    target = start()
    cookie = session_cookie(outsider)
    paths = (run_page(target), "/ws/inbox/", "/ws/runs/")

    async def scenario() -> None:
        for path in paths:
            communicator = socket(path, cookie=cookie)
            connected, _ = await communicator.connect()
            assert not connected, path
            await communicator.disconnect()

    run(scenario)


def test_it_refuses_a_run_that_does_not_exist(viewer: User) -> None:
    cookie = session_cookie(viewer)

    async def scenario() -> None:
        communicator = socket("/ws/runs/run_missing/", cookie=cookie)
        connected, _ = await communicator.connect()
        assert not connected
        await communicator.disconnect()

    run(scenario)


def test_it_counts_open_sockets(viewer: User) -> None:
    target = start()
    cookie = session_cookie(viewer)
    url = run_page(target)

    async def scenario() -> None:
        before = OPEN_WEBSOCKETS._value.get()
        communicator = socket(url, cookie=cookie)
        connected, _ = await communicator.connect()
        assert connected
        assert OPEN_WEBSOCKETS._value.get() == before + 1
        await communicator.disconnect()
        assert OPEN_WEBSOCKETS._value.get() == before

    run(scenario)


# --- What a commit pushes --------------------------------------------------------------------


def test_it_pushes_exactly_one_frame_with_the_new_state_after_a_commit(
    operator: User, viewer: User
) -> None:
    target = start()
    lease = claim()
    cp = services.checkpoint_save(**epochs(lease), step="ask", state={})
    url = run_page(target)

    async def scenario() -> None:
        communicator = socket(url, cookie=await db(session_cookie)(viewer))
        connected, _ = await communicator.connect()
        assert connected
        first = await pushed(communicator)
        # The page is as fresh as the socket: the snapshot is only the nav badge.
        assert len(first) == 1 and 'id="inbox-count"' in first[0]
        assert status_in(first[0], target) is None

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
        got = await pushed(communicator)
        assert len(got) == 1
        assert status_in(got[0], target) == "input_required"
        assert "Which versions?" in got[0]
        for part in ("status", "facts", "controls", "pending", "attempts", "timeline"):
            assert re.search(rf'id="run-{target.id}-{part}"[^>]*hx-swap-oob="true"', got[0])
        await communicator.disconnect()

    run(scenario)


def test_it_pushes_one_frame_for_one_transaction_of_many_events(viewer: User) -> None:
    target, _lease, _cp, _req = interrupted()
    url = run_page(target)

    async def scenario() -> None:
        communicator = socket(url, cookie=await db(session_cookie)(viewer))
        assert (await communicator.connect())[0]
        await pushed(communicator)

        def cancel() -> int:
            before = Run.objects.get(pk=target.id).last_event_seq
            services.run_cancel(run_id=target.id, reason="not needed")
            return Run.objects.get(pk=target.id).last_event_seq - before

        events = await db(cancel)()
        assert events >= 2  # the request closes and the run is cancelled, in one commit
        got = await pushed(communicator)
        assert len(got) == 1
        assert status_in(got[0], target) == "cancelled"
        await communicator.disconnect()

    run(scenario)


def test_it_pushes_nothing_for_a_rolled_back_transaction(viewer: User) -> None:
    target = start()
    url = run_page(target)

    async def scenario() -> None:
        communicator = socket(url, cookie=await db(session_cookie)(viewer))
        assert (await communicator.connect())[0]
        await pushed(communicator)

        def change_then_fail() -> None:
            with pytest.raises(RuntimeError), transaction.atomic():  # noqa: PT012 - the rollback is the point
                locked = Run.objects.select_for_update().get(pk=target.id)
                append_event(locked, "agent.log", "worker:w1", {"message": "never seen"})
                locked.save(update_fields=["last_event_seq"])
                raise RuntimeError("rolled back")

        await db(change_then_fail)()
        assert await silent(communicator)
        await communicator.disconnect()

    run(scenario)


def test_it_sends_a_reconnecting_page_what_it_missed(viewer: User) -> None:
    target = start()
    url = run_page(target)  # the page was rendered now; its socket always opens this URL
    cookie = session_cookie(viewer)

    async def scenario() -> None:
        communicator = socket(url, cookie=cookie)
        assert (await communicator.connect())[0]
        await pushed(communicator)
        await communicator.disconnect()  # the network drops

        await db(claim)()  # meanwhile a worker takes the run

        communicator = socket(url, cookie=cookie)
        assert (await communicator.connect())[0]
        snapshot = await pushed(communicator)
        assert len(snapshot) == 1
        assert status_in(snapshot[0], target) == "running"
        assert f'id="run-{target.id}-attempts"' in snapshot[0]
        await communicator.disconnect()

    run(scenario)


def test_it_leaves_other_runs_pages_alone_but_keeps_their_badge(
    operator: User, viewer: User
) -> None:
    watched = start()
    claim()
    url = run_page(watched)

    async def scenario() -> None:
        communicator = socket(url, cookie=await db(session_cookie)(operator))
        assert (await communicator.connect())[0]
        await pushed(communicator)

        await db(start)()  # another run starts: nothing on this page changes
        assert await silent(communicator)

        await db(interrupted)()  # another run asks the operator something: the badge moves
        got = await pushed(communicator)
        assert len(got) == 1
        assert re.search(r'id="inbox-count"[^>]*>1<', got[0])
        assert f"run-{watched.id}-status" not in got[0]
        await communicator.disconnect()

    run(scenario)


# --- Permissions at render -------------------------------------------------------------------


def test_it_sends_nothing_to_a_user_who_lost_the_view_permission(viewer: User) -> None:
    target = start()
    url = run_page(target)

    async def scenario() -> None:
        communicator = socket(url, cookie=await db(session_cookie)(viewer))
        assert (await communicator.connect())[0]
        await pushed(communicator)

        await db(lambda: viewer.groups.remove(Group.objects.get(name="viewer")))()
        await db(claim)()

        output = await communicator.receive_output(timeout=2)
        assert output == {"type": "websocket.close", "code": 4403}
        await communicator.disconnect()

    run(scenario)


def test_it_closes_the_socket_of_a_session_that_ended(viewer: User) -> None:
    target = start()
    url = run_page(target)

    async def scenario() -> None:
        communicator = socket(url, cookie=await db(session_cookie)(viewer))
        assert (await communicator.connect())[0]
        await pushed(communicator)

        await db(lambda: Session.objects.all().delete())()  # signed out everywhere
        await db(claim)()

        output = await communicator.receive_output(timeout=2)
        assert output == {"type": "websocket.close", "code": 4401}
        await communicator.disconnect()

    run(scenario)


# --- The inbox and the runs list ----------------------------------------------------------


def inbox_url(user: User, tab: str = "needs") -> str:
    """The socket URL of a freshly rendered inbox (its token says what the page shows)."""
    from dashboard.pages.inbox import inbox_context

    return f"/ws/inbox/?tab={tab}&v={inbox_context(user, tab)['live_token']}"


def test_it_adds_and_removes_inbox_cards_for_everyone_who_may_answer(
    operator: User, approver: User
) -> None:
    async def scenario() -> None:
        mine = socket(await db(inbox_url)(operator), cookie=await db(session_cookie)(operator))
        theirs = socket(await db(inbox_url)(approver), cookie=await db(session_cookie)(approver))
        for communicator in (mine, theirs):
            assert (await communicator.connect())[0]
            assert len(await pushed(communicator)) == 1  # the badge: the list is current

        target, _lease, _cp, req = await db(interrupted)()
        for communicator in (mine, theirs):
            got = await pushed(communicator)
            assert len(got) == 1
            assert 'id="inbox-list"' in got[0]
            assert f'id="request-{req.id}"' in got[0]
            assert re.search(r'id="inbox-count"[^>]*>1<', got[0])

        # The approver answers: the card leaves the operator's inbox at once, and stays in
        # the approver's, read-only.
        await db(
            lambda: services.run_resume(
                run_id=target.id,
                request_id=req.id,
                checkpoint_id=req.checkpoint_id,
                value={"versions": ["v2"]},
                user=approver,
            )
        )()
        gone = await pushed(mine)
        assert len(gone) == 1
        assert 'id="inbox-list"' in gone[0]
        assert f'id="request-{req.id}"' not in gone[0]
        assert re.search(r'id="inbox-count"[^>]*>0<', gone[0])
        kept = await pushed(theirs)
        assert len(kept) == 1
        assert f'id="request-{req.id}"' in kept[0]
        assert 'data-version="answered.shut.can"' in kept[0]
        assert "answer-form" not in kept[0]
        for communicator in (mine, theirs):
            await communicator.disconnect()

    run(scenario)


def test_it_marks_an_expired_request_in_every_open_inbox_and_run_page(operator: User) -> None:
    target, _lease, _cp, req = interrupted(expires_in=600)
    cookie = session_cookie(operator)
    urls = (inbox_url(operator), run_page(target))

    async def scenario() -> None:
        sockets = [socket(url, cookie=cookie) for url in urls]
        for communicator in sockets:
            assert (await communicator.connect())[0]
            await pushed(communicator)

        def expire() -> int:
            from runs.models import InputRequest
            from runs.services import requests_expire

            InputRequest.objects.filter(pk=req.id).update(expires_at=req.created_at)
            return requests_expire()

        assert await db(expire)() == 1
        for communicator in sockets:
            got = await pushed(communicator)
            assert len(got) == 1
            card = re.search(rf'<article[^>]*id="request-{req.id}".*?</article>', got[0], re.S)
            assert card, got[0][:500]
            assert 'data-version="expired.shut.can"' in card.group(0)
            assert "answer-form" not in card.group(0)
            assert "Expired" in card.group(0)
        for communicator in sockets:
            await communicator.disconnect()

    run(scenario)


def test_it_updates_the_runs_list(viewer: User) -> None:
    from dashboard.pages.runs import run_list_context

    first = start()

    async def scenario() -> None:
        token = (await db(run_list_context)(viewer, {}))["live_token"]
        communicator = socket(f"/ws/runs/?v={token}", cookie=await db(session_cookie)(viewer))
        assert (await communicator.connect())[0]
        assert len(await pushed(communicator)) == 1  # the badge only

        await db(claim)()  # a row changes: that row and the status counts
        got = await pushed(communicator)
        assert len(got) == 1
        assert f'id="run-{first.id}-row"' in got[0]
        assert 'id="runs-status-tabs"' in got[0]
        assert 'id="runs-rows"' not in got[0]
        assert 'data-status="running"' in got[0]

        second = await db(start)()  # a run joins the page: the whole body
        got = await pushed(communicator)
        assert len(got) == 1
        assert 'id="runs-rows"' in got[0]
        assert got[0].index(f"run-{second.id}-row") < got[0].index(f"run-{first.id}-row")
        await communicator.disconnect()

    run(scenario)


def test_it_keeps_the_badge_of_other_pages(operator: User) -> None:
    async def scenario() -> None:
        communicator = socket("/ws/live/?v=0", cookie=await db(session_cookie)(operator))
        assert (await communicator.connect())[0]
        assert await silent(communicator)  # the page's count (0) is right

        await db(interrupted)()
        got = await pushed(communicator)
        assert len(got) == 1
        assert re.search(r'id="inbox-count"[^>]*hx-swap-oob="true"[^>]*>1<', got[0])
        await communicator.disconnect()

    run(scenario)


@pytest.mark.redis
def test_a_socket_idle_longer_than_the_layers_blocking_read_stays_open(viewer: User) -> None:
    # channels_redis waits for messages with BRPOP for 5 s; redis-py 8 gives its sockets a
    # 5 s read timeout by default, so an idle socket's consumer died ("Timeout reading")
    # every few seconds unless the layer's connections wait longer (config/settings.py).
    target = start()
    lease = claim()
    url = run_page(target)

    async def scenario() -> None:
        communicator = socket(url, cookie=await db(session_cookie)(viewer))
        connected, _ = await communicator.connect()
        assert connected
        await pushed(communicator)
        assert await silent(communicator, seconds=12)  # idle, and no close frame either
        await db(lambda: services.checkpoint_save(**epochs(lease), step="later", state={}))()
        got = await pushed(communicator)
        assert any(f'id="run-{target.id}-' in frame for frame in got)
        await communicator.disconnect()

    run(scenario)
