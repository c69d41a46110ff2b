"""Both clients send a keyed call again, with the same Idempotency-Key, when the connection
drops under it: closed without an answer (a server whose keep-alive ran out as the request
arrived: httpx ``RemoteProtocolError``, Node "other side closed") or reset (``ReadError``,
``ECONNRESET``), on a reused keep-alive connection; and after a 503 ``overloaded`` they wait
past its ``Retry-After`` before the next try.

The server is a real TCP server speaking HTTP/1.1 that answers, closes or resets each
request as scripted.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import threading
import time
from typing import Any

import pytest
from holdpoint_client.http import Api, retry_delay

from tests.clients.node import CLIENT, build

pytestmark = pytest.mark.process


class DroppingServer:
    """Each request, in arrival order, gets the next scripted action: ``ok`` (200 with
    keep-alive), ``close`` (FIN, no answer), ``reset`` (RST, no answer) or ``overloaded``
    (503 problem with ``Retry-After: 1``). Records (idempotency key, arrival time)."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.seen: list[tuple[str, float, str]] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def __enter__(self) -> DroppingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buffer = b""
        with conn:
            conn.settimeout(10)
            while True:
                while b"\r\n\r\n" not in buffer:
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (
                        line.partition(":") for line in head.decode("latin-1").split("\r\n")[1:]
                    )
                }
                length = int(headers.get("content-length", "0"))
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                buffer = buffer[length:]
                with self._lock:
                    action = self.script.pop(0) if self.script else "ok"
                    self.seen.append((headers.get("idempotency-key", ""), time.monotonic(), action))
                if action == "close":
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                if action == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if action == "overloaded":
                    body = json.dumps({"code": "overloaded", "status": 503, "retry_after": 1})
                    status, extra = "503 Service Unavailable", "Retry-After: 1\r\n"
                    kind = "application/problem+json"
                else:
                    body, status, extra, kind = '{"ok": true}', "200 OK", "", "application/json"
                conn.sendall(
                    f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n{extra}"
                    f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
                )


@pytest.mark.parametrize("drop", ["close", "reset"])
def test_python_sends_a_keyed_call_again_when_a_reused_connection_drops(drop: str) -> None:
    with DroppingServer(["ok", drop, drop, "ok"]) as server:
        api = Api(server.url, "hpw_test")
        try:
            assert api.call("POST", "/api/x", {"n": 1}) == (200, {"ok": True})
            assert api.call("POST", "/api/x", {"n": 2}) == (200, {"ok": True})
        finally:
            api.close()
    keys = [key for key, _, _ in server.seen]
    assert [action for _, _, action in server.seen] == ["ok", drop, drop, "ok"]
    # The second call, dropped twice, was the same write each time: one key.
    assert keys[1] == keys[2] == keys[3] != keys[0]


def test_python_waits_past_retry_after_before_sending_a_refused_call_again() -> None:
    with DroppingServer(["overloaded", "ok"]) as server:
        api = Api(server.url, "hpw_test")
        try:
            assert api.call("POST", "/api/x", {}) == (200, {"ok": True})
        finally:
            api.close()
    (key1, at1, _), (key2, at2, _) = server.seen
    assert key1 == key2
    assert at2 - at1 >= 1.0
    # Jitter past Retry-After: refused workers do not all come back in the same instant.
    drawn = [retry_delay(1, 1.0) for _ in range(200)]
    assert all(1.0 <= d <= 1.5 for d in drawn) and len(set(drawn)) > 100


NODE_CALLS = """
import { Api } from "./dist/index.js";
const api = new Api(process.argv[1], "hpw_test");
const out = [];
for (const n of [1, 2]) {
  try {
    const [status, data] = await api.call("POST", "/api/x", { n }, { retryForMs: 30000 });
    out.push({ status, data });
  } catch (error) {
    out.push({ error: String(error) });
  }
}
console.log(JSON.stringify(out));
"""


def node_calls(url: str) -> list[dict[str, Any]]:
    build()
    result = subprocess.run(
        ["node", "--input-type=module", "-e", NODE_CALLS, url],
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("drop", ["close", "reset"])
def test_typescript_sends_a_keyed_call_again_when_a_reused_connection_drops(drop: str) -> None:
    with DroppingServer(["ok", drop, drop, "ok"]) as server:
        answers = node_calls(server.url)
    assert answers == [{"status": 200, "data": {"ok": True}}] * 2
    keys = [key for key, _, _ in server.seen]
    assert [action for _, _, action in server.seen] == ["ok", drop, drop, "ok"]
    assert keys[1] == keys[2] == keys[3] != keys[0]


def test_typescript_waits_past_retry_after_before_sending_a_refused_call_again() -> None:
    with DroppingServer(["overloaded", "ok"]) as server:
        answers = node_calls(server.url)
    assert answers == [{"status": 200, "data": {"ok": True}}] * 2
    (key1, at1, _), (key2, at2, _), _third = server.seen
    assert key1 == key2
    assert at2 - at1 >= 1.0
