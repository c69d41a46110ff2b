"""Request bodies over ``HOLDPOINT_MAX_BODY_BYTES`` are refused before they are read.

Every request (API, dashboard forms, login) passes two guards, both answering ``413``
``application/problem+json`` with the code ``payload_too_large`` and nothing processed:

- **In daphne** (``install_daphne_guard``). Twisted reads the whole body into a file
  before daphne hands the request on, and daphne then queues the whole file, chunk by
  chunk, in memory for the application (``daphne.http_protocol.WebRequest.process``): a
  1 GiB body made the web process 1 GiB larger before any Django code could look at it.
  The guard is a ``WebRequest`` subclass that refuses a declared ``Content-Length`` over
  the limit as soon as the headers are in, counts a chunked body while it streams in and
  refuses it the moment it passes the limit, then discards the rest and closes the
  connection. It is installed into daphne's HTTP factory when ``config.asgi`` is
  imported, which every way of starting daphne here does first (the Procfile's
  ``daphne config.asgi:application``, ``manage.py serve``, the chaos harness, the bench,
  the tests' live server).
- **In ASGI** (``BodyLimitMiddleware``, outermost in ``config.asgi``), for any other
  ASGI server: the same two refusals on the ``http.request`` messages, before Django's
  handler reads (and spools) the body.

``api.problems.ApiBoundaryMiddleware`` keeps its own check inside Django as a last line.
The reverse proxy in front should refuse large bodies first (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

from api.problems import CONTENT_TYPE, problem_body, render_problem

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]

# After refusing, the rest of a body is read and dropped for at most this long before the
# connection is closed, so that the client is still reading when the 413 arrives (closing
# with unread data makes the kernel answer with a reset that can swallow the response).
LINGER_SECONDS = 2.0


def body_limit() -> int:
    return int(settings.HOLDPOINT_MAX_BODY_BYTES)


def refusal(path: str, *, declared: int | None) -> bytes:
    """The problem+json body of the refusal."""
    limit = body_limit()
    detail = (
        f"The body is {declared} bytes; the limit is {limit} bytes."
        if declared is not None
        else f"The body is larger than the limit of {limit} bytes."
    )
    return render_problem(
        problem_body("payload_too_large", detail, 413, path[:200] or None, limit=limit)
    )


def _declared_length(headers: Any) -> int | str | None:
    """The Content-Length, None without one, or "bad" when it is not a number."""
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return "bad"
            return length if length >= 0 else "bad"
    return None


class BodyLimitMiddleware:
    """ASGI middleware: refuse an HTTP body over the limit before the application reads it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit()
        path = str(scope.get("path", ""))
        declared = _declared_length(scope.get("headers") or [])
        if declared == "bad":
            await _answer(
                send,
                400,
                render_problem(
                    problem_body("malformed_request", "Content-Length is not a number.", 400, path)
                ),
            )
            return
        if isinstance(declared, int) and declared > limit:
            await _answer(send, 413, refusal(path, declared=declared))
            return

        received = 0
        exceeded = False
        response_started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Django's handler stops reading at a disconnect and answers nothing;
                    # the refusal is sent below instead.
                    exceeded = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal response_started
            if exceeded:
                return
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        await self.app(scope, limited_receive, guarded_send)
        if exceeded and not response_started:
            await _answer(send, 413, refusal(path, declared=None))


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", CONTENT_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# --- daphne --------------------------------------------------------------------------------


class _Discard:
    """Where the rest of a refused body goes."""

    closed = False

    def write(self, data: bytes) -> None:
        pass

    def read(self, size: int = -1) -> bytes:
        return b""

    def seek(self, *args: Any) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


def install_daphne_guard() -> None:
    """Make daphne build body-limited requests (idempotent; see the module docstring)."""
    import daphne.server
    from daphne.http_protocol import HTTPFactory, WebRequest
    from twisted.internet import reactor

    if getattr(daphne.server.HTTPFactory, "holdpoint_body_limit", False):
        return

    class BodyLimitedWebRequest(WebRequest):
        refused = False
        body_received = 0

        def gotLength(self, length: int | None) -> None:
            if length is not None and length > body_limit():
                # No "100 Continue" after the refusal: a client that asked first (curl
                # does for large bodies) then sends nothing at all.
                self.requestHeaders.removeHeader(b"Expect")
                self._refuse(declared=length)
                return
            super().gotLength(length)

        def handleContentChunk(self, data: bytes) -> None:
            if self.refused:
                return
            self.body_received += len(data)
            if self.body_received > body_limit():
                self._refuse(declared=None)
                return
            super().handleContentChunk(data)

        def process(self) -> Any:
            if self.refused:
                return None  # Never handed to the application.
            return super().process()

        def check_timeouts(self) -> None:
            if not self.refused:
                super().check_timeouts()

        def _refuse(self, *, declared: int | None) -> None:
            self.refused = True
            old: Any = getattr(self, "content", None)
            self.content = _Discard()
            if old is not None:
                old.close()
            # The request line is the channel's until the whole body is in (Twisted).
            raw = getattr(self, "path", None) or getattr(self.channel, "_path", b"") or b""
            path = raw.split(b"?", 1)[0].decode("ascii", "replace")
            body = refusal(path, declared=declared)
            transport = self.channel.transport
            transport.write(
                b"HTTP/1.1 413 Payload Too Large\r\n"
                + f"Content-Type: {CONTENT_TYPE}\r\n".encode()
                + f"Content-Length: {len(body)}\r\n".encode()
                + b"Connection: close\r\n\r\n"
                + body
            )
            clock: Any = reactor
            clock.callLater(LINGER_SECONDS, transport.loseConnection)

    class BodyLimitedHTTPFactory(HTTPFactory):
        holdpoint_body_limit = True

        def buildProtocol(self, addr: Any) -> Any:
            protocol = super().buildProtocol(addr)
            protocol.requestFactory = BodyLimitedWebRequest
            return protocol

    daphne.server.HTTPFactory = BodyLimitedHTTPFactory
