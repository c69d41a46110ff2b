"""The demo webhook receiver behaves like an idempotent API with a lookup by key."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from runtime.demo_receiver import DemoReceiver


def call(method: str, url: str, body: dict | None = None, key: str | None = None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def receiver():
    with DemoReceiver() as r:
        yield r


def test_the_same_key_is_one_delivery(receiver) -> None:
    first = call("POST", f"{receiver.url}/hooks/billing", {"a": 1}, key="k1")
    again = call("POST", f"{receiver.url}/hooks/billing", {"a": 1}, key="k1")
    assert first[0] == 201 and again[0] == 200
    assert first[1]["id"] == again[1]["id"]
    assert len(receiver.book.all()) == 1
    assert call("GET", f"{receiver.url}/deliveries/k1") == (200, first[1])
    assert call("GET", f"{receiver.url}/deliveries/nope")[0] == 404


def test_a_slow_delivery_is_in_progress_then_delivered(receiver) -> None:
    thread = threading.Thread(
        target=call, args=("POST", f"{receiver.url}/hooks/slow?delay=0.5", {}, "k2")
    )
    thread.start()
    time.sleep(0.2)
    assert call("GET", f"{receiver.url}/deliveries/k2")[0] == 409
    thread.join(5)
    assert call("GET", f"{receiver.url}/deliveries/k2")[0] == 200


def test_a_delivery_needs_a_key(receiver) -> None:
    assert call("POST", f"{receiver.url}/hooks/x", {})[0] == 400
