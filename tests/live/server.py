"""An ASGI live server for browser tests: daphne serving ``config.asgi`` (pages and
websockets) from a thread of the test process, as ``manage.py serve`` does.

pytest-django's ``live_server`` is WSGI and cannot open a websocket. Running daphne in a
thread (not a subprocess) keeps what the WSGI server gave the tests: it reads the test
database the test commits to, sees the ``settings`` fixture's changes, and shares the
process's in-memory channel layer, so a change the test makes through the services is
pushed to the browser. With ``REDIS_URL`` set, pushes from other processes (a
``runagents`` worker) arrive through Redis as in production.

Twisted's reactor runs once per process, so there is one server per test session.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

from channels.layers import get_channel_layer
from django.test.utils import modify_settings

from tests.waiting import wait_for

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class AsgiLiveServer:
    """Quacks like pytest-django's ``LiveServer`` (``url``, the ALLOWED_HOSTS override)."""

    def __init__(self) -> None:
        self.port = free_port()
        self._live_server_modified_settings = modify_settings(ALLOWED_HOSTS={"append": HOST})
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __str__(self) -> str:
        return self.url

    def start(self) -> AsgiLiveServer:
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server  # installs Twisted's asyncio reactor

        from config.asgi import application

        self._server = Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=HOST, port=self.port),
            signal_handlers=False,
            action_logger=None,
            verbosity=0,
            websocket_timeout=86400,
            ready_callable=self._ready.set,
        )
        self._thread = threading.Thread(
            target=self._server.run, name="daphne-live-server", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("daphne did not start within 15 s")
        self._wait_listening()
        return self

    def _wait_listening(self) -> None:
        for _ in range(150):
            with socket.socket() as sock:
                if sock.connect_ex((HOST, self.port)) == 0:
                    return
            threading.Event().wait(0.1)
        raise RuntimeError(f"daphne is not listening on {self.url}")

    def stop(self) -> None:
        from twisted.internet import reactor

        if self._thread is not None and self._thread.is_alive():
            reactor.callFromThread(reactor.stop)  # type: ignore[attr-defined]
            self._thread.join(15)


def wait_until_no_loop_receives(seconds: float = 10.0) -> None:
    """Wait until no event loop receives on this process's channel layer.

    The browser tests' live server (one per session, in a thread) receives while a page
    has a socket open; the sockets of a closed page are torn down there a moment later,
    and one that was reconnecting may open just before.
    """
    layer = get_channel_layer()
    wait_for(
        lambda: not getattr(layer, "receive_count", 0),
        seconds,
        "the last loop to stop receiving",
        give_up=True,
    )


def own_channel_layer() -> None:
    """Let the next event loop start on a channel layer no other loop has received on.

    A scenario (``tests.live.conftest.run``) has an event loop of its own, and the live
    server's loop lives all session. channels_redis binds a layer's asyncio locks to the
    loop that first waits on them: the receive lock while a loop receives, and a
    channel's clean lock, which a cleaner task of the receiving loop holds a moment after
    ``receive_count`` is back to 0. A scenario contending for a lock the server's loop
    (or a finished scenario's) holds fails "bound to a different event loop", and the
    lock stays held for every later test: one cascade of failures. A fresh layer per
    scenario shares none of them; messages still cross through Redis.
    """
    from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers

    channel_layers.backends.pop(DEFAULT_CHANNEL_LAYER, None)
