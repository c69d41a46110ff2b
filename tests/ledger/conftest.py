"""Real things for the ledger's tools to act on: a loopback webhook receiver, a temp
config store, Django's locmem mail outbox."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

# The real WSGI handler may serve requests inside a test's transaction (schemathesis).
from tests.api.conftest import keep_test_connection  # noqa: F401


class Receiver:
    """A well-behaved idempotent HTTP API: the first POST with a key does the work, a
    repeat with the same key gets the first answer back and does nothing.

    ``mode``: ``ok``; ``slow`` (sleeps ``slow_seconds`` before doing the work, past the
    client's timeout; the work is still done, as a slow server would); ``reject``
    (422, nothing done); ``error`` (500 after doing nothing).
    """

    def __init__(self) -> None:
        self.mode = "ok"
        self.slow_seconds = 1.0
        self.performed: Counter[str] = Counter()  # the work done, per key
        self.received: Counter[str] = Counter()  # POSTs received, per key
        self.lookups: Counter[str] = Counter()
        self.stored: dict[str, dict[str, Any]] = {}
        self.bodies: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.done = threading.Condition(self.lock)
        self.stopping = threading.Event()
        self.base = ""

    def url(self, path: str = "/hooks/deploy") -> str:
        return self.base + path

    @property
    def lookup_template(self) -> str:
        return self.base + "/deliveries/{idempotency_key}"

    def wait_performed(self, key: str, timeout: float = 5.0) -> None:
        with self.done:
            assert self.done.wait_for(lambda: self.performed[key] > 0, timeout=timeout)

    def handle_post(self, key: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.received[key] += 1
            if key in self.stored:
                return 200, self.stored[key]
            mode = self.mode
        if mode == "reject":
            return 422, {"error": "the receiver refused this request"}
        if mode == "error":
            return 500, {"error": "internal error"}
        if mode == "slow":
            self.stopping.wait(self.slow_seconds)
        with self.done:
            if key not in self.stored:
                self.performed[key] += 1
                delivery = {"id": f"dlv_{len(self.stored) + 1}", "path": path, "key": key}
                self.stored[key] = delivery
                self.bodies[key] = body
                self.done.notify_all()
            return 201, self.stored[key]

    def handle_lookup(self, key: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.lookups[key] += 1
            if key in self.stored:
                return 200, self.stored[key]
        return 404, {"error": "no such delivery"}


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass  # The client gave up waiting (the timeout test); the work is done anyway.

        def do_POST(self) -> None:
            key = self.headers.get("Idempotency-Key")
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not key:
                self._answer(400, {"error": "Idempotency-Key is required"})
                return
            status, payload = receiver.handle_post(key, self.path, json.loads(raw or b"null"))
            self._answer(status, payload)

        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if not path.startswith("/deliveries/"):
                self._answer(404, {"error": "not found"})
                return
            status, payload = receiver.handle_lookup(unquote(path.removeprefix("/deliveries/")))
            self._answer(status, payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    """A webhook receiver on 127.0.0.1, wired into the webhook tool's settings."""
    receiver = Receiver()
    server = _Server(("127.0.0.1", 0), _handler(receiver))
    host, port = server.server_address[:2]
    receiver.base = f"http://{host}:{port}"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    settings.HOLDPOINT_WEBHOOK_LOOKUP_URL = receiver.lookup_template
    settings.HOLDPOINT_WEBHOOK_TIMEOUT_SECONDS = 0.3
    try:
        yield receiver
    finally:
        receiver.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def config_dir(settings: Any, tmp_path: Path) -> Path:
    directory = tmp_path / "config-store"
    settings.HOLDPOINT_CONFIG_STORE_DIR = directory
    return directory


@pytest.fixture
def mailbox(mailoutbox: list[Any]) -> list[Any]:
    """Django's locmem outbox (pytest-django switches the test run to the locmem backend)."""
    return mailoutbox


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    # The personas are created with passwords; the real hasher costs ~0.2 s per user.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
