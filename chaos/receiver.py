"""The loopback webhook server of the chaos run: it counts every delivery by its key.

It behaves like an idempotent API (the same ``Idempotency-Key`` gets the same answer,
and the effect happens once), and it answers lookups (``GET /deliveries/<key>``) so
the ledger can ask what happened to a pending side effect. Unlike a real API it
remembers every POST with its time, so the harness can check the ledger's discipline:
no POST without a key, no key that the ledger does not know, and no key sent again
after the ledger had recorded it as confirmed.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


class Deliveries:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.numbers = itertools.count(1)
        self.first: dict[str, dict[str, Any]] = {}
        self.posts: dict[str, list[float]] = {}
        self.without_key = 0

    def post(self, key: str | None, path: str, body: Any) -> dict[str, Any]:
        with self.lock:
            if not key:
                self.without_key += 1
                return {"error": "Idempotency-Key required"}
            self.posts.setdefault(key, []).append(time.time())
            if key not in self.first:
                self.first[key] = {
                    "id": f"dlv_{next(self.numbers):05d}",
                    "status": "delivered",
                    "path": path,
                    "idempotency_key": key,
                }
            return self.first[key]

    def lookup(self, key: str) -> dict[str, Any] | None:
        with self.lock:
            return self.first.get(key)


class _Handler(BaseHTTPRequestHandler):
    book: Deliveries

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = raw.decode(errors="replace")
        key = self.headers.get("Idempotency-Key")
        parts = urlsplit(self.path)
        delivery = self.book.post(key, parts.path, body)
        # ?delay=S: the effect has happened, but the answer comes later than the webhook
        # tool waits: the sender cannot know, and the ledger must record "unknown".
        delay = parse_qs(parts.query).get("delay")
        if delay:
            time.sleep(min(float(delay[0]), 30.0))
        if "error" in delivery:
            self._answer(400, delivery)
        else:
            self._answer(201, delivery)

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path.startswith("/deliveries/"):
            delivery = self.book.lookup(unquote(path.removeprefix("/deliveries/")))
            if delivery is None:
                self._answer(404, {"status": "not_found"})
            else:
                self._answer(200, delivery)
            return
        self._answer(200, {"ok": True})


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A sender that gave up waiting (the webhook tool's timeout) closed its end; that
        # is the point of ?delay, not an error of the receiver.
        pass


def start(port: int) -> tuple[ThreadingHTTPServer, Deliveries]:
    book = Deliveries()
    handler = type("Handler", (_Handler,), {"book": book})
    server = _Server(("127.0.0.1", port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="receiver").start()
    return server, book
