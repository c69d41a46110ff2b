"""A real HTTP server with a script: it answers each request with the next answer scripted
for its method and path, and records what came (the time, the Idempotency-Key, the body).

The clients' retry rules are behaviour of the clients, not of the Holdpoint server (which
rarely fails on cue): this server fails on cue, over real HTTP, so that a test sees what a
client sends again, how long it waits between tries, and what it never sends again.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any = None
    delay: float = 0.0  # Seconds the server takes before it answers.
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Seen:
    at: float  # time.monotonic() when the request came
    method: str
    path: str
    key: str
    body: Any


def problem(status: int, code: str, detail: str = "") -> Answer:
    return Answer(status, {"status": status, "code": code, "detail": detail or code})


class ScriptedServer:
    """``script[(method, path)]``: the answers in order; the last one is repeated. A path
    without a script is answered 404 (and recorded)."""

    def __init__(self, script: dict[tuple[str, str], list[Answer]], port: int = 0) -> None:
        self.script = {route: list(answers) for route, answers in script.items()}
        self.seen: list[Seen] = []
        self._counts: dict[tuple[str, str], int] = defaultdict(int)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def requests(self, method: str, path: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if (s.method, s.path) == (method, path)]

    def _answer(self, method: str, path: str, key: str, body: Any) -> Answer:
        route = (method, path)
        with self._lock:
            self.seen.append(Seen(time.monotonic(), method, path, key, body))
            answers = self.script.get(route)
            if not answers:
                return problem(404, "not_found")
            index = min(self._counts[route], len(answers) - 1)
            self._counts[route] += 1
            return answers[index]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                answer = server._answer(
                    self.command, self.path, self.headers.get("Idempotency-Key", ""), body
                )
                if answer.delay:
                    time.sleep(answer.delay)
                payload = b"" if answer.body is None else json.dumps(answer.body).encode()
                self.send_response(answer.status)
                kind = "application/problem+json" if answer.status >= 400 else "application/json"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(payload)))
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = _serve

        return Handler
