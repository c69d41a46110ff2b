"""A loopback HTTP receiver that records every request whole (method, path, headers,
body) and answers as told: for the outbound guard's tests (issue 13, findings 3 and 7)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Recorder:
    base: str = ""
    seen: list[Seen] = field(default_factory=list)
    # What to answer: a status, a body, and optionally a drip (seconds between bytes).
    status: int = 201
    body: bytes = b'{"id": "dlv_1"}'
    drip_seconds: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str = "/hooks/deploy") -> str:
        return self.base + path


def _handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _record(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with recorder.lock:
                recorder.seen.append(
                    Seen(self.command, self.path, {k: v for k, v in self.headers.items()}, raw)
                )
            try:
                self.send_response(recorder.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(recorder.body)))
                self.send_header("Connection", "close")
                self.end_headers()
                if recorder.drip_seconds:
                    for byte in recorder.body:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(recorder.drip_seconds)
                else:
                    self.wfile.write(recorder.body)
            except OSError:
                pass  # The client stopped reading (the limits under test): expected.

        do_POST = _record
        do_GET = _record

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def recording_receiver() -> Iterator[Recorder]:
    recorder = Recorder()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(recorder))
    server.daemon_threads = True
    recorder.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()


def json_body(seen: Seen) -> Any:
    return json.loads(seen.body or b"null")
