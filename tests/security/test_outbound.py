"""Issue 13, finding 3: every outbound call goes through one guarded client.

Against a real loopback receiver, the real ledger services, the worker API and the
compensation the web process runs. Loopback is what the guard refuses by default, so
each test turns ``HOLDPOINT_OUTBOUND_ALLOW_LOCAL`` off where the guard is under test (the
suite turns it on for every other test, tests/conftest.py).
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.outbound import DestinationNotAllowed, check_destination
from ledger.tools import ActionFailed, get_tool
from runs.errors import HoldpointError
from tests.api.conftest import client_for, worker_client
from tests.api.conftest import post as api_post
from tests.runs.factory import claim, epochs, start
from tests.security.outbound_receiver import Recorder, recording_receiver

pytestmark = pytest.mark.django_db

UNDO = "http://hooks.example.com/undo"


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with recording_receiver() as recorder:
        yield recorder


@pytest.fixture
def guarded(settings: Any) -> Any:
    settings.HOLDPOINT_OUTBOUND_ALLOW_LOCAL = False
    settings.HOLDPOINT_WEBHOOK_ALLOW = []
    return settings


def compensable(url: str, **request: Any) -> dict[str, Any]:
    """A webhook call declared compensable, so that no approval is involved."""
    return {
        "tool": "webhook",
        "target": "deploy-hook",
        "request": {"url": url, "body": {"v": 1}, **request},
        "reversibility": "compensable",
        "compensating_action": {"url": UNDO, "body": {"undo": 1}},
    }


INTERNAL = [
    "http://127.0.0.1:6379/",
    "http://localhost:8799/admin",
    "http://LOCALHOST./x",
    "http://10.0.0.5/hook",
    "http://172.16.3.4/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",  # shared address space (carrier-grade NAT)
    "http://169.254.169.254/latest/meta-data/",
    "http://0.0.0.0:8000/",
    "http://224.0.0.1/",
    "http://[::1]:8000/",
    "http://[::]/",
    "http://[fe80::1]/",
    "http://[fd00::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]:6379/",
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
    "http://[2002:7f00:1::]/",  # 6to4 of 127.0.0.1
]


@pytest.mark.parametrize("url", INTERNAL)
def test_it_refuses_internal_destinations_before_anything_is_written(
    guarded: Any, url: str
) -> None:
    start()
    lease = claim()
    with pytest.raises(HoldpointError) as refused:
        ledger.side_effect_begin(**epochs(lease), step_id="notify", **compensable(url))
    assert refused.value.code == "destination_not_allowed"
    assert refused.value.status == 422
    assert not SideEffect.objects.exists()


def test_a_compensating_action_to_an_internal_address_is_refused_at_begin(guarded: Any) -> None:
    start()
    lease = claim()
    call = compensable("http://hooks.example.com/deploy")
    call["compensating_action"] = {"url": "http://127.0.0.1:8799/internal", "body": {}}
    with pytest.raises(HoldpointError) as refused:
        ledger.side_effect_begin(**epochs(lease), step_id="notify", **call)
    assert refused.value.code == "destination_not_allowed"
    assert not SideEffect.objects.exists()


def test_the_worker_api_answers_a_refused_destination_with_a_problem(guarded: Any) -> None:
    start()
    lease = claim()
    client = worker_client("outbound-worker")
    body = {
        "lease_epoch": lease.lease_epoch,
        "cancel_epoch": lease.cancel_epoch,
        "step_id": "notify",
        **compensable("http://127.0.0.1:6379/"),
    }
    response = api_post(client, f"/api/worker/attempts/{lease.attempt_id}/side-effects", body)
    assert response.status_code == 422
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "destination_not_allowed"
    assert problem["address"] == "127.0.0.1"
    assert not SideEffect.objects.exists()


def test_the_tool_sends_nothing_to_an_internal_address(guarded: Any, recorder: Recorder) -> None:
    with pytest.raises(DestinationNotAllowed):
        get_tool("webhook").execute({"url": recorder.url(), "body": {}}, "key-1")
    assert recorder.seen == []


def test_a_name_that_resolves_to_loopback_is_a_failed_outcome(
    guarded: Any, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The name passes the check at begin (no DNS there); the answer at act time points
    # at loopback, as a rebinding attacker's DNS would. The tool refuses: "failed", not
    # "unknown", and the receiver got nothing.
    port = int(recorder.base.rsplit(":", 1)[1])
    real = socket.getaddrinfo

    def resolver(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    start()
    lease = claim()
    done = ledger.side_effect_perform(
        **epochs(lease), step_id="notify", **compensable(f"http://rebind.example:{port}/x")
    )
    assert done.side_effect.status == "failed"
    assert done.side_effect.error["type"] == "DestinationNotAllowed"
    assert recorder.seen == []


def test_the_checked_address_is_the_one_connected_to(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Local destinations allowed (as in the suite): the name is resolved once per call
    # and the connection goes to that answer, not to a second, different one.
    port = int(recorder.base.rsplit(":", 1)[1])
    answers = iter(["127.0.0.1", "10.255.255.1", "10.255.255.1"])
    asked: list[str] = []
    real = socket.getaddrinfo

    def resolver(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "pinned.example":
            asked.append(host)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    done = get_tool("webhook").execute({"url": f"http://pinned.example:{port}/x"}, "key-1")
    assert done.result["status_code"] == 201
    assert asked == ["pinned.example"]
    assert len(recorder.seen) == 1
    assert recorder.seen[0].headers["Host"] == f"pinned.example:{port}"


@pytest.mark.parametrize(
    "headers",
    [
        {"Host": "internal.example"},
        {"host": "internal.example"},
        {"Transfer-Encoding": "chunked"},
        {"Connection": "keep-alive, Upgrade"},
        {"Content-Length": "0"},
        {"X-Note": "a\r\nX-Injected: 1"},
        {"X-Note": "a\nb"},
        {"Bad Name": "x"},
        {"X-Note:": "x"},
    ],
)
def test_agents_may_not_set_host_framing_or_crlf_headers(
    headers: dict[str, str], recorder: Recorder
) -> None:
    start()
    lease = claim()
    with pytest.raises(HoldpointError) as refused:
        ledger.side_effect_begin(
            **epochs(lease), step_id="notify", **compensable(recorder.url(), headers=headers)
        )
    assert refused.value.code == "invalid_input"
    assert not SideEffect.objects.exists()
    with pytest.raises(ActionFailed):
        get_tool("webhook").execute({"url": recorder.url(), "headers": headers}, "key-1")
    assert recorder.seen == []


def test_compensating_headers_with_crlf_are_refused_at_begin(recorder: Recorder) -> None:
    start()
    lease = claim()
    call = compensable(recorder.url())
    call["compensating_action"] = {"url": recorder.url("/undo"), "headers": {"X-A": "1\r\n2"}}
    with pytest.raises(HoldpointError) as refused:
        ledger.side_effect_begin(**epochs(lease), step_id="notify", **call)
    assert refused.value.code == "invalid_input"
    assert not SideEffect.objects.exists()


def test_the_allow_list_is_the_only_way_out(guarded: Any, settings: Any) -> None:
    settings.HOLDPOINT_WEBHOOK_ALLOW = ["hooks.example.com", "*.corp.example", "10.9.0.0/16"]
    check_destination("https://hooks.example.com/x")
    check_destination("https://ci.corp.example/x")
    check_destination("http://10.9.1.2/x")  # an internal range the operator named
    for url in ("http://10.8.0.1/x", "http://[::1]/x"):
        with pytest.raises(DestinationNotAllowed):
            check_destination(url)
    # A name the list does not name is judged by the addresses it resolves to.
    public = [ipaddress.IPv4Address("8.8.8.8")]
    for url in ("https://evil.example/x", "https://corp.example.evil/"):
        with pytest.raises(DestinationNotAllowed):
            check_destination(url, addresses=public)
    settings.HOLDPOINT_WEBHOOK_ALLOW = ["hooks.example.com"]
    with pytest.raises(DestinationNotAllowed):
        check_destination("https://evil.example/x")  # refused without resolving it
    with pytest.raises(ActionFailed):
        check_destination("http://user:pw@hooks.example.com/")


def test_a_reply_is_read_and_stored_only_up_to_the_limit(settings: Any, recorder: Recorder) -> None:
    settings.HOLDPOINT_OUTBOUND_MAX_REPLY_BYTES = 4096
    recorder.body = b'{"id": "dlv_1", "pad": "' + b"x" * 1_000_000 + b'"}'
    start()
    lease = claim()
    done = ledger.side_effect_perform(
        **epochs(lease), step_id="notify", **compensable(recorder.url())
    )
    effect = done.side_effect
    assert effect.status == "confirmed"
    assert effect.result["body_truncated"] is True
    assert len(effect.result["body"]) <= 4096


def test_a_reply_that_drips_is_cut_at_the_total_time(settings: Any, recorder: Recorder) -> None:
    # Each byte comes well within the socket timeout; only the total limit stops it.
    settings.HOLDPOINT_OUTBOUND_TOTAL_SECONDS = 1.5
    recorder.body = b"x" * 200
    recorder.drip_seconds = 0.1
    started = time.monotonic()
    done = get_tool("webhook").execute({"url": recorder.url(), "body": {}}, "key-1")
    assert time.monotonic() - started < 6
    assert done.result["status_code"] == 201
    assert done.result["body_truncated"] is True


def test_viewers_do_not_see_what_a_receiver_answered(
    recorder: Recorder, viewer: User, operator: User
) -> None:
    recorder.body = b'{"id": "dlv_1", "internal": "redis_version:7.2.4"}'
    run = start()
    lease = claim()
    done = ledger.side_effect_perform(
        **epochs(lease), step_id="notify", **compensable(recorder.url())
    )
    url = f"/api/side-effects/{done.side_effect.operation_id}"
    seen_by_viewer = client_for(viewer).get(url)
    assert seen_by_viewer.status_code == 200
    assert "redis_version" not in seen_by_viewer.content.decode()
    assert seen_by_viewer.json()["result"]["status_code"] == 201
    for path in (f"/api/runs/{run.id}/report", f"/api/runs/{run.id}/side-effects"):
        assert "redis_version" not in client_for(viewer).get(path).content.decode()
    assert "redis_version" in client_for(operator).get(url).content.decode()
    page = client_for(viewer)
    page.force_login(viewer)
    assert "redis_version" not in page.get(f"/side-effects/runs/{run.id}/").content.decode()


def test_a_refused_reply_body_stays_out_of_the_events(recorder: Recorder, viewer: User) -> None:
    recorder.status = 422
    recorder.body = b'{"error": "secret internal detail"}'
    run = start()
    lease = claim()
    done = ledger.side_effect_perform(
        **epochs(lease), step_id="notify", **compensable(recorder.url())
    )
    assert done.side_effect.status == "failed"
    payloads = [str(e.payload) for e in run.events.all()]
    assert not any("secret internal detail" in p for p in payloads)


def test_the_web_process_does_not_compensate_into_an_internal_address(
    settings: Any, recorder: Recorder, operator: User
) -> None:
    # Written while local destinations were allowed (as a demo would); compensated by a
    # person after the deployment turned them off: the web process sends nothing.
    start()
    lease = claim()
    call = compensable(recorder.url())
    call["compensating_action"] = {"url": recorder.url("/undo"), "body": {}}
    done = ledger.side_effect_perform(**epochs(lease), step_id="notify", **call)
    assert done.side_effect.status == "confirmed"
    settings.HOLDPOINT_OUTBOUND_ALLOW_LOCAL = False
    response = api_post(
        client_for(operator),
        f"/api/side-effects/{done.side_effect.operation_id}/compensate",
        {"reason": "undo for the test"},
        key="undo-1",
    )
    assert response.status_code == 200
    assert response.json()["status"] == "compensation_failed"
    assert response.json()["compensation"]["error"]["type"] == "DestinationNotAllowed"
    assert [s.path for s in recorder.seen] == ["/hooks/deploy"]
