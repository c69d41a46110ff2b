"""One hub per web process: one channel in the push group, one render at a time for all
the sockets of the process (``render_batch``), pushes arriving meanwhile merged into the
next render. The sockets themselves are ``live/consumers.py``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import weakref
import zoneinfo
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import close_old_connections
from django.http import HttpRequest
from django.utils import timezone, translation

from dashboard.actions import user_timezone
from live import broadcast
from live.roles import Person, live_request
from live.sessions import session_key, signed_in_users
from runs.selectors import VIEW

logger = logging.getLogger(__name__)

T = TypeVar("T")
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


class Socket(Protocol):
    """What the hub needs of a socket (``live/consumers.py`` ``LiveConsumer``)."""

    scope: dict[str, Any]
    requires_view: bool

    def concerned(self, change: Change) -> bool: ...

    def render(
        self, request: HttpRequest, person: Person, change: Change | None, batch: Batch
    ) -> str: ...

    async def deliver(self, reply: Reply) -> None: ...


# --- One render for every socket of the process ---------------------------------------------


@dataclass
class Change:
    """What a render is about: ``None`` for a socket's first render (a snapshot)."""

    run_ids: frozenset[str]
    request_run_ids: frozenset[str]
    # Workers whose presence changed, agents whose gate changed: a queued run's reason to
    # wait may have changed with them (``runs.selectors.waiting_for_runs``).
    worker_ids: frozenset[str] = frozenset()
    agents: frozenset[str] = frozenset()

    @property
    def waiting(self) -> bool:
        return bool(self.worker_ids or self.agents)


@dataclass
class Reply:
    html: str = ""
    close: int | None = None


@dataclass
class Batch:
    """Shared by the sockets of one render: what one computed, the others reuse."""

    memo: dict[Any, Any] = field(default_factory=dict)
    # The language and time zone switched on for the sockets being rendered (part of the
    # keys of what is rendered once for many), read once per group of sockets.
    language: str = ""
    zone: str = ""

    def get(self, key: Any, make: Callable[[], T]) -> T:
        if key not in self.memo:
            self.memo[key] = make()
        value: T = self.memo[key]
        return value


def render_batch(
    sockets: list[Socket],
    change: Change | None,
    snapshots: set[Socket],
    emit: Callable[[Socket, Reply], None] | None = None,
) -> list[tuple[Socket, Reply]]:
    """Render one push (``change``) for ``sockets``, and first renders for ``snapshots``.

    Each reply goes to ``emit`` as soon as it is rendered (the event loop sends it while
    the next is rendered), and is returned too. Who each socket's session stands for and
    what they may do are read again for every push (``signed_in_users``); what a socket
    asks of its page's request (its cookies: CSRF token, language, time zone) is read once
    per socket, since a socket's scope never changes. Sockets are taken by language and
    zone, so each is switched on once per push.
    """
    users = signed_in_users(s.scope for s in sockets)
    batch = Batch()
    replies = []

    def reply(socket: Socket, answer: Reply) -> None:
        replies.append((socket, answer))
        if emit is not None:
            emit(socket, answer)

    todo: list[tuple[Socket, Person, Page]] = []
    for socket in sockets:
        person = users.get(session_key(socket.scope))
        if person is None:
            reply(socket, Reply(close=SIGNED_OUT))
            continue
        if socket.requires_view and not person.has_perm(VIEW):
            reply(socket, Reply(close=FORBIDDEN))
            continue
        if socket not in snapshots and (change is None or not socket.concerned(change)):
            continue
        todo.append((socket, person, _page(socket)))
    todo.sort(key=lambda item: item[2].order)
    for (language, zone), group in itertools.groupby(todo, key=lambda item: item[2].order):
        with translation.override(language), timezone.override(group_zone(zone)):
            batch.language = translation.get_language()
            batch.zone = timezone.get_current_timezone_name()
            for socket, person, page in group:
                first = socket in snapshots
                page.request.LANGUAGE_CODE = batch.language
                try:
                    html = socket.render(page.request, person, None if first else change, batch)
                except Exception:
                    # One page that cannot be rendered must not keep the others waiting.
                    logger.exception("live render failed for %s", socket.scope.get("path"))
                    continue
                if html:
                    reply(socket, Reply(html=html))
    return replies


@dataclass
class Page:
    """What a socket's page asks of its request, read once per socket: the request (its
    cookies: the CSRF token), its language and time zone."""

    request: HttpRequest
    order: tuple[str, str]


_pages: weakref.WeakKeyDictionary[Any, Page] = weakref.WeakKeyDictionary()


def _page(socket: Socket) -> Page:
    page = _pages.get(socket)
    if page is None:
        request = live_request(socket.scope)
        language = translation.get_language_from_request(request)
        zone = user_timezone(request)
        page = Page(request, (language, zone.key if zone is not None else ""))
        _pages[socket] = page
    return page


def group_zone(name: str) -> Any:
    """The zone of a group of sockets: "" for the server's."""
    return zoneinfo.ZoneInfo(name) if name else None


class Hub:
    """The live sockets of one event loop (one web process), their one channel in the
    push group, and their renders, one at a time."""

    def __init__(self) -> None:
        self.sockets: set[Socket] = set()
        self.snapshots: set[Socket] = set()
        self.run_ids: set[str] = set()
        self.request_run_ids: set[str] = set()
        self.worker_ids: set[str] = set()
        self.agents: set[str] = set()
        self.changed = False
        self.wake = asyncio.Event()
        self.channel = ""
        self.tasks: list[asyncio.Task[None]] = []
        self.lock = asyncio.Lock()

    async def add(self, socket: Socket) -> None:
        async with self.lock:
            if not self.tasks:
                await self._start()
            self.sockets.add(socket)
            self.snapshots.add(socket)
            self.wake.set()

    async def remove(self, socket: Socket) -> None:
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
            self.worker_ids |= _ids(message.get("worker_ids"))
            self.agents |= _ids(message.get("agents"))
            self.changed = True
            self.wake.set()

    async def _render(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            change = None
            if self.changed:
                change = Change(
                    frozenset(self.run_ids),
                    frozenset(self.request_run_ids),
                    frozenset(self.worker_ids),
                    frozenset(self.agents),
                )
                self.run_ids, self.request_run_ids, self.changed = set(), set(), False
                self.worker_ids, self.agents = set(), set()
            snapshots, self.snapshots = self.snapshots, set()
            sockets = list(self.sockets)
            if not sockets:
                continue
            # Each frame is sent as soon as its page is rendered: the event loop writes
            # (and compresses) frames while the thread renders the next ones. A render
            # waits for the previous one's frames, so a socket's frames keep their order.
            sending: list[asyncio.Future[None]] = []
            emit = _sender(asyncio.get_running_loop(), sending)
            try:
                await _in_thread(render_batch)(sockets, change, snapshots, emit)
            except Exception:
                logger.exception("live render failed")
            await asyncio.sleep(0)  # the frames emitted last are scheduled
            for failed in await asyncio.gather(*sending, return_exceptions=True):
                if failed is not None:
                    logger.error("live push not sent", exc_info=failed)


def _sender(
    loop: asyncio.AbstractEventLoop, sending: list[asyncio.Future[None]]
) -> Callable[[Socket, Reply], None]:
    """What the render thread calls with each reply: the loop sends it (into ``sending``)."""

    def emit(socket: Socket, reply: Reply) -> None:
        def send() -> None:
            sending.append(asyncio.ensure_future(socket.deliver(reply)))

        loop.call_soon_threadsafe(send)

    return emit


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
