"""The HTTP side: one ``httpx.Client`` per worker, problem+json errors, and retries.

Every write carries an ``Idempotency-Key``; a request that got no answer (the server was
away, a 502/503/504, a 429, a 409 ``idempotency_in_progress``) is sent again with the
same key, with backoff, so a retried write is never done twice and its first answer
comes back.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import httpx

RETRY_STATUSES = frozenset({429, 502, 503, 504})


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
    ) -> None:
        self.url = url.rstrip("/")
        self.stop = stop or threading.Event()
        self._client = httpx.Client(
            base_url=self.url,
            headers={
                "Authorization": f"Bearer {token}",
                "User-Agent": "holdpoint-client-python/0.1",
                "Accept": "application/json",
            },
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
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
        delay = 0.1
        while True:
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
            else:
                data = _json(response)
                status = response.status_code
                in_progress = status == 409 and _code(data) == "idempotency_in_progress"
                if status < 400:
                    return status, data
                if status not in RETRY_STATUSES and not in_progress:
                    raise Problem(status, data if isinstance(data, dict) else {"detail": data})
                reason = f"{method} {path}: {status}"
                after = response.headers.get("retry-after")
                if after and after.isdigit():
                    delay = max(delay, min(float(after), 30.0))
            if self.stop.is_set() and not persist:
                raise ServerAway(f"{reason} (stopping)")
            if time.monotonic() + delay > deadline:
                raise ServerAway(reason)
            self.stop.wait(delay)
            delay = min(delay * 2, 5.0)


def _json(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return {"detail": response.text[:500]}


def _code(data: Any) -> str:
    return str(data.get("code")) if isinstance(data, dict) else ""
