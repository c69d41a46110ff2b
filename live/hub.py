"""One hub per web process: one channel in the push group, one render at a time for all
the sockets of the process (``render_batch``), pushes arriving meanwhile merged into the
next render. The sockets themselves are ``live/consumers.py``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
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


@dataclass
class Reply:
    html: str = ""
    close: int | None = None


@dataclass
class Batch:
    """Shared by the sockets of one render: what one computed, the others reuse."""

    memo: dict[Any, Any] = field(default_factory=dict)

    def get(self, key: Any, make: Callable[[], T]) -> T:
        if key not in self.memo:
            self.memo[key] = make()
        value: T = self.memo[key]
        return value


def render_batch(
    sockets: list[Socket], change: Change | None, snapshots: set[Socket]
) -> list[tuple[Socket, Reply]]:
    """Render one push (``change``) for ``sockets``, and first renders for ``snapshots``."""
    users = signed_in_users(s.scope for s in sockets)
    batch = Batch()
    replies = []
    for socket in sockets:
        person = users.get(session_key(socket.scope))
        if person is None:
            replies.append((socket, Reply(close=SIGNED_OUT)))
            continue
        if socket.requires_view and not person.has_perm(VIEW):
            replies.append((socket, Reply(close=FORBIDDEN)))
            continue
        first = socket in snapshots
        if not first and (change is None or not socket.concerned(change)):
            continue
        request = live_request(socket.scope)
        language = translation.get_language_from_request(request)
        try:
            with translation.override(language), timezone.override(user_timezone(request)):
                request.LANGUAGE_CODE = translation.get_language()
                html = socket.render(request, person, None if first else change, batch)
        except Exception:
            # One page that cannot be rendered must not keep the others waiting.
            logger.exception("live render failed for %s", socket.scope.get("path"))
            continue
        if html:
            replies.append((socket, Reply(html=html)))
    return replies


class Hub:
    """The live sockets of one event loop (one web process), their one channel in the
    push group, and their renders, one at a time."""

    def __init__(self) -> None:
        self.sockets: set[Socket] = set()
        self.snapshots: set[Socket] = set()
        self.run_ids: set[str] = set()
        self.request_run_ids: set[str] = set()
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
            self.changed = True
            self.wake.set()

    async def _render(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            change = None
            if self.changed:
                change = Change(frozenset(self.run_ids), frozenset(self.request_run_ids))
                self.run_ids, self.request_run_ids, self.changed = set(), set(), False
            snapshots, self.snapshots = self.snapshots, set()
            sockets = list(self.sockets)
            if not sockets:
                continue
            try:
                replies = await _in_thread(render_batch)(sockets, change, snapshots)
            except Exception:
                logger.exception("live render failed")
                continue
            for socket, reply in replies:
                await socket.deliver(reply)


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
