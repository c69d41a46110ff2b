"""A webhook receiver for the demos: ``python manage.py demoreceiver --port 8765``.

It behaves like a well-made idempotent API, so the webhook tool has something real
to talk to:

- ``POST /hooks/<name>`` records a delivery under its ``Idempotency-Key`` and answers
  ``201 {"id": "dlv_…"}``; the same key again gets the same answer (no second delivery).
  ``?delay=S`` makes it take S seconds first — longer than the webhook tool's timeout,
  and the sender cannot tell whether it arrived (the ledger records ``unknown``).
- ``GET /deliveries/<key>`` is the lookup: ``200`` with the delivery, ``409`` while a
  delivery with that key is still being processed, ``404`` when it never arrived. Point
  ``HOLDPOINT_WEBHOOK_LOOKUP_URL`` at ``http://HOST:PORT/deliveries/{idempotency_key}``.
- ``POST /hooks/<name>/retract`` receives a compensation; ``GET /deliveries`` lists all.

It binds to 127.0.0.1 by default and keeps everything in memory.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


class DeliveryBook:
    """Deliveries by idempotency key, safe to share between request threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self.deliveries: dict[str, dict[str, Any]] = {}
        self.in_progress: set[str] = set()
        self.received = 0

    def begin(self, key: str) -> dict[str, Any] | None:
        """Return the earlier delivery for ``key``, or None after marking it in progress."""
        with self._lock:
            self.received += 1
            if key in self.deliveries:
                return self.deliveries[key]
            self.in_progress.add(key)
            return None

    def finish(self, key: str, name: str, body: Any) -> dict[str, Any]:
        with self._lock:
            self.in_progress.discard(key)
            if key not in self.deliveries:
                self.deliveries[key] = {
                    "id": f"dlv_{next(self._numbers):04d}",
                    "status": "delivered",
                    "hook": name,
                    "idempotency_key": key,
                    "body": body,
                    "received_at": time.time(),
                }
            return self.deliveries[key]

    def look_up(self, key: str) -> tuple[int, Any]:
        with self._lock:
            if key in self.deliveries:
                return 200, self.deliveries[key]
            if key in self.in_progress:
                return 409, {"status": "in_progress"}
            return 404, {"status": "not_found"}

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.deliveries.values())


class _Handler(BaseHTTPRequestHandler):
    book: DeliveryBook
    server_version = "HoldpointDemoReceiver/1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path == "/deliveries":
            return self._reply(200, self.book.all())
        if parts.path.startswith("/deliveries/"):
            status, body = self.book.look_up(unquote(parts.path[len("/deliveries/") :]))
            return self._reply(status, body)
        return self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self._reply(400, {"error": "the body is not JSON"})
        if not parts.path.startswith("/hooks/"):
            return self._reply(404, {"error": "not found"})
        key = self.headers.get("Idempotency-Key")
        if not key:
            return self._reply(400, {"error": "Idempotency-Key is required"})
        name = parts.path[len("/hooks/") :]
        earlier = self.book.begin(key)
        if earlier is not None:
            return self._reply(200, earlier)
        delay = float(parse_qs(parts.query).get("delay", ["0"])[0])
        if delay > 0:
            time.sleep(min(delay, 60.0))
        delivery = self.book.finish(key, name, body)
        # The sender may have given up waiting; the delivery happened all the same.
        with contextlib.suppress(OSError):
            self._reply(201, delivery)


class DemoReceiver:
    """The receiver on a thread: ``with DemoReceiver() as r: r.url``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.book = DeliveryBook()
        handler = type("Handler", (_Handler,), {"book": self.book})
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def lookup_url(self) -> str:
        return f"{self.url}/deliveries/{{idempotency_key}}"

    def start(self) -> DemoReceiver:
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="demo-receiver", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> DemoReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
