"""The HTTP side: one ``httpx.Client`` per worker, problem+json errors, and retries.

Every write carries an ``Idempotency-Key``; a request that got no answer (a connection
error, the connection dropped under it: ``ReadError``, ``RemoteProtocolError``; any 5xx,
503 ``overloaded`` included; a 429; a 409 ``idempotency_in_progress``) is sent again with
the same key, with backoff (``backoff``: bounded, with jitter; past ``Retry-After`` when
the server gave one, plus up to half of it again, so that workers refused together do
not come back together), so a retried write is never done twice and its first answer
comes back. Any other 4xx is the server's word: never sent again.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any

import httpx

# Besides every 5xx (the server failed, or a proxy could not reach it): worth another try.
RETRY_STATUSES = frozenset({429})

# Backoff between tries: from BACKOFF_FIRST doubling to BACKOFF_MAX seconds.
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 5.0


def backoff(tries: int) -> float:
    """The pause after ``tries`` failed tries in a row (1, 2, …): 0.1 s doubling up to 5 s,
    each drawn between half and all of that (jitter), so workers that failed together (two
    started at once, a server restarting under all of them) do not come back together."""
    ceiling = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** min(max(tries, 1) - 1, 30))
    return random.uniform(ceiling / 2, ceiling)


def retry_delay(tries: int, retry_after: float) -> float:
    """The pause before the next try: the backoff, or past the server's ``Retry-After``
    by a random part of up to half of it (jitter)."""
    if retry_after > 0:
        return max(backoff(tries), retry_after * random.uniform(1.0, 1.5))
    return backoff(tries)


def retryable(status: int, data: Any) -> bool:
    """Whether an answer with ``status`` is worth sending again (with the same key)."""
    in_progress = status == 409 and _code(data) == "idempotency_in_progress"
    return status >= 500 or status in RETRY_STATUSES or in_progress


def _header_text(value: object, limit: int) -> str:
    """A header value: printable ASCII (anything else becomes ``?``), at most ``limit``."""
    text = "".join(c if " " <= c <= "~" else "?" for c in str(value))
    return text[:limit].strip()


def identity_headers(
    *,
    name: str,
    client: str,
    host: str,
    pid: int,
    concurrency: int,
    agents: list[str],
    lease_seconds: float | None,
    wait: float,
) -> dict[str, str]:
    """The ``Holdpoint-Worker-*`` headers that tell the server who this worker is (the
    Workers page; docs/protocol.md, identity), each within the server's limits."""
    headers = {
        "Holdpoint-Worker-Name": _header_text(name, 100) or "worker",
        "Holdpoint-Worker-Client": _header_text(client, 141),
        "Holdpoint-Worker-Host": _header_text(host, 200),
        "Holdpoint-Worker-Pid": str(int(pid)),
        "Holdpoint-Worker-Concurrency": str(int(concurrency)),
        "Holdpoint-Worker-Agents": ",".join(
            _header_text(a, 100).replace(",", "?") for a in agents[:100]
        ),
        "Holdpoint-Worker-Wait-Seconds": f"{float(wait):g}",
    }
    if lease_seconds:
        headers["Holdpoint-Worker-Lease-Seconds"] = f"{float(lease_seconds):g}"
    return headers


class Problem(Exception):
    """The server refused: ``status``, its stable ``code``, ``detail`` and the extra members."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        self.code = str(body.get("code") or f"http_{status}")
        self.detail = str(body.get("detail") or body.get("title") or "")
        super().__init__(f"{status} {self.code}: {self.detail}")


class ServerAway(Exception):
    """No answer from the server within the retry budget."""


class Api:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 30.0,
        stop: threading.Event | None = None,
        transport: httpx.BaseTransport | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.stop = stop or threading.Event()
        self.closed = False
        self._client = httpx.Client(
            base_url=self.url,
            headers={
                "Authorization": f"Bearer {token}",
                "User-Agent": "holdpoint-client-python/0.1",
                "Accept": "application/json",
                # Who this worker is, on every call (``identity_headers``).
                **(headers or {}),
            },
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self.closed = True
        self._client.close()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        key: str | None = None,
        timeout: float | None = None,
        retry_for: float = 30.0,
        persist: bool = False,
    ) -> tuple[int, Any]:
        """Send; return ``(status, json)``. Raise ``Problem`` for a refusal and ``ServerAway``
        when no answer came within ``retry_for`` seconds (or the worker is stopping, unless
        ``persist``: an outcome of an action is a fact worth waiting for)."""
        headers = {"Idempotency-Key": key or str(uuid.uuid4())}
        deadline = time.monotonic() + retry_for
        tries = 0
        while True:
            tries += 1
            after = 0.0
            if self.closed:
                # The worker stopped (past its grace) while a thread was still sending.
                raise ServerAway(f"{method} {path}: the worker has stopped")
            try:
                response = self._client.request(
                    method,
                    path,
                    json=body,
                    headers=headers,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError as exc:
                reason = f"{method} {path}: {type(exc).__name__}: {exc}"
            except RuntimeError as exc:  # httpx: the client was closed meanwhile
                if not self.closed:
                    raise
                raise ServerAway(f"{method} {path}: the worker has stopped") from exc
            else:
                data = _json(response)
                status = response.status_code
                if status < 400:
                    return status, data
                if not retryable(status, data):
                    raise Problem(status, data if isinstance(data, dict) else {"detail": data})
                reason = f"{method} {path}: {status}"
                header = response.headers.get("retry-after", "")
                if header.isdigit():
                    after = min(float(header), 30.0)
            if self.stop.is_set() and not persist:
                raise ServerAway(f"{reason} (stopping)")
            delay = retry_delay(tries, after)
            if time.monotonic() + delay > deadline:
                raise ServerAway(reason)
            if persist:
                time.sleep(delay)  # Stopping does not hurry a call that must get through.
            else:
                self.stop.wait(delay)


def _json(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return {"detail": response.text[:500]}


def _code(data: Any) -> str:
    return str(data.get("code")) if isinstance(data, dict) else ""
