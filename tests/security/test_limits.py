"""Issue 13, finding 4: a body over ``HOLDPOINT_MAX_BODY_BYTES`` is refused before it is
read, declared (``Content-Length``) or streamed (chunked), for every kind of request.

Two levels, both real: the project's ASGI application called as a server calls it, and
the Procfile's web (uvicorn) and live (daphne) processes started as the Procfile starts
them, spoken to over a socket. The memory figure
(1 GiB sent, the web process within +20 MiB) is measured by ``bench/body_limit.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.signals import request_started

from bench.body_limit import procfile_line
from config.asgi import application
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 256 * 1024
CHUNK = 64 * 1024


class Client:
    """Feeds the application a body as a server would, and records what comes back."""

    def __init__(self, chunks: int, declared: int | None) -> None:
        self.chunks_left = chunks
        self.declared = declared
        self.receives = 0
        self.messages: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if self.chunks_left < 0:
            # After the body a server waits for the client to go away; Django cancels this
            # listener once it has answered.
            await asyncio.sleep(3600)
        self.receives += 1
        if self.chunks_left == 0:
            self.chunks_left -= 1
            return {"type": "http.request", "body": b"", "more_body": False}
        self.chunks_left -= 1
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": True}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def call(self, path: str) -> tuple[int, dict[bytes, bytes], bytes]:
        headers = [(b"host", b"testserver"), (b"content-type", b"application/json")]
        if self.declared is not None:
            headers.append((b"content-length", str(self.declared).encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        # In a thread of its own: the browser tests' Playwright keeps an event loop running
        # in the main thread, where asyncio.run would refuse to start.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, application(scope, self.receive, self.send)).result()
        start = next(m for m in self.messages if m["type"] == "http.response.start")
        body = b"".join(
            m.get("body", b"") for m in self.messages if m["type"] == "http.response.body"
        )
        return start["status"], dict(start["headers"]), body


@pytest.fixture
def requests_started() -> Iterator[list[Any]]:
    """Every request Django began to handle (the signal comes once the body is read)."""
    started: list[Any] = []

    def record(**kwargs: Any) -> None:
        started.append(kwargs)

    request_started.connect(record)
    yield started
    request_started.disconnect(record)


@pytest.fixture(autouse=True)
def _limit(settings: Any) -> None:
    settings.HOLDPOINT_MAX_BODY_BYTES = LIMIT


def assert_refused(status: int, headers: dict[bytes, bytes], body: bytes) -> dict[str, Any]:
    assert status == 413
    assert headers[b"content-type"] == b"application/problem+json"
    problem = json.loads(body)
    assert problem["code"] == "payload_too_large"
    assert problem["limit"] == LIMIT
    return problem


@pytest.mark.parametrize("path", ["/api/runs", "/login/", "/runs/new"])
def test_a_declared_body_over_the_limit_is_refused_unread(
    path: str, requests_started: list[Any]
) -> None:
    client = Client(chunks=16, declared=1024**3)
    problem = assert_refused(*client.call(path))
    assert problem["detail"] == f"The body is {1024**3} bytes; the limit is {LIMIT} bytes."
    assert client.receives == 0
    assert requests_started == []


@pytest.mark.parametrize("path", ["/api/runs", "/login/", "/runs/new"])
def test_a_streamed_body_is_cut_at_the_limit(path: str, requests_started: list[Any]) -> None:
    client = Client(chunks=10_000, declared=None)  # 640 MB if it were all read
    assert_refused(*client.call(path))
    assert client.receives == LIMIT // CHUNK + 1
    assert requests_started == []


def test_a_body_within_the_limit_is_handled(requests_started: list[Any]) -> None:
    client = Client(chunks=2, declared=None)
    status, _, body = client.call("/api/runs")
    assert status == 401  # Anonymous: the view's own answer, after the body was read.
    assert json.loads(body)["code"] == "not_authenticated"
    assert len(requests_started) == 1


# --- The web servers, started as the Procfile starts them -------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module", params=["web", "live"])
def server_url(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """The Procfile's web (uvicorn) or live (daphne) process, as the Procfile starts it."""
    port = _free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "HOLDPOINT_MAX_BODY_BYTES": str(LIMIT),
        "LOG_LEVEL": "WARNING",
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "LIVE_PORT": str(port),
        "WEB_CONCURRENCY": "1",
    }
    process = subprocess.Popen(
        ["bash", "-c", f"exec {procfile_line(request.param)}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def listening() -> bool:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return True
            assert process.poll() is None, f"the Procfile's {request.param} process exited"
            return False

        wait_for(listening, 30, f"the Procfile's {request.param} process", interval=0.2)
        yield ("127.0.0.1", port)
    finally:
        process.terminate()
        process.wait(10)


def _exchange(address: tuple[str, int], head: bytes, body: Iterator[bytes]) -> bytes:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(head)
        try:
            for piece in body:
                sock.sendall(piece)
        except OSError:
            pass  # The server closed after refusing: what a refusal may do.
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < 40:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
        return answer


def _parse(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body.startswith(b"{") else {}


@pytest.mark.process
def test_the_server_refuses_a_declared_body_before_it_arrives(
    server_url: tuple[str, int],
) -> None:
    head = (
        b"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {1024**3}\r\n\r\n".encode()
    )
    # Only 64 KiB of the 1 GiB are ever sent: the answer must not wait for the rest.
    status, problem = _parse(_exchange(server_url, head, iter([b"x" * CHUNK])))
    assert status == 413
    assert problem["code"] == "payload_too_large"


@pytest.mark.process
def test_the_server_cuts_a_chunked_body_at_the_limit(server_url: tuple[str, int]) -> None:
    head = (
        b"POST /login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n\r\n"
    )
    chunk = f"{CHUNK:x}\r\n".encode() + b"x" * CHUNK + b"\r\n"
    # Twice the limit, and never a last chunk: the answer comes at the limit.
    status, problem = _parse(_exchange(server_url, head, iter([chunk] * (2 * LIMIT // CHUNK))))
    assert status == 413
    assert problem["code"] == "payload_too_large"


@pytest.mark.process
def test_the_server_still_serves_a_body_within_the_limit(server_url: tuple[str, int]) -> None:
    body = b'{"agent": "x"}'
    head = (
        b"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
    )
    status, problem = _parse(_exchange(server_url, head, iter([body])))
    assert status == 401
    assert problem["code"] == "not_authenticated"
