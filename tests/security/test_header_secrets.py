"""Issue 13, finding 7: secrets in webhook headers are sent but never stored or shown.

The ledger writes the intent before the act, so it never has the secret to store: the
request and the compensating action are saved with "[redacted]" in place of every
secret-looking header, while the caller hands the tool the real request in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User

from ledger import services as ledger
from ledger.models import SideEffect
from ledger.outbound import REDACTED, is_secret_header
from tests.api.conftest import client_for, worker_client
from tests.api.conftest import post as api_post
from tests.runs.factory import claim, epochs, start
from tests.security.outbound_receiver import Recorder, recording_receiver

pytestmark = pytest.mark.django_db

SECRETS = {
    "Authorization": "Bearer sk-live-ALPHA",
    "Cookie": "session=COOKIE-BETA",
    "X-Api-Key": "KEY-GAMMA",
    "X-Auth-Token": "TOKEN-DELTA",
    "X-Webhook-Secret": "SECRET-EPSILON",
    "X-Db-Password": "PASSWORD-ZETA",
}
PLAIN = {"X-Trace-Id": "trace-1", "Accept-Language": "en"}
VALUES = [v.split("=")[-1].split()[-1] for v in SECRETS.values()]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with recording_receiver() as recorder:
        yield recorder


def test_it_knows_which_headers_are_secret() -> None:
    for name in [*SECRETS, "Set-Cookie", "Proxy-Authorization", "x-github-token"]:
        assert is_secret_header(name), name
    for name in PLAIN:
        assert not is_secret_header(name), name


def _stored_text(effect: SideEffect) -> str:
    effect.refresh_from_db()
    return json.dumps([effect.request, effect.compensating_action])


def test_secret_headers_are_sent_but_stored_redacted(
    recorder: Recorder, viewer: User, operator: User
) -> None:
    run = start()
    lease = claim()
    done = ledger.side_effect_perform(
        **epochs(lease),
        step_id="notify",
        tool="webhook",
        target="deploy-hook",
        request={"url": recorder.url(), "body": {"v": 1}, "headers": {**SECRETS, **PLAIN}},
        reversibility="compensable",
        compensating_action={
            "url": recorder.url("/undo"),
            "body": {},
            "headers": {"Authorization": "Bearer undo-OMEGA", "X-Trace-Id": "undo-trace"},
        },
    )
    effect = done.side_effect
    assert effect.status == "confirmed"
    # Sent as given.
    sent = recorder.seen[0].headers
    for name, value in {**SECRETS, **PLAIN}.items():
        assert sent[name] == value
    # Stored redacted: the request, the compensating action.
    stored = _stored_text(effect)
    for value in [*VALUES, "undo-OMEGA"]:
        assert value not in stored
    assert effect.request["headers"]["Authorization"] == REDACTED
    assert effect.request["headers"]["X-Trace-Id"] == "trace-1"
    assert effect.compensating_action["headers"] == {
        "Authorization": REDACTED,
        "X-Trace-Id": "undo-trace",
    }
    # Not in the events, the report or the dashboard either, for anyone.
    events = json.dumps([e.payload for e in run.events.all()])
    for user in (viewer, operator):
        client = client_for(user)
        texts = [
            client.get(f"/api/runs/{run.id}/report").content.decode(),
            client.get(f"/api/side-effects/{effect.operation_id}").content.decode(),
        ]
        client.force_login(user)
        texts.append(client.get(f"/side-effects/runs/{run.id}/").content.decode())
        for value in [*VALUES, "undo-OMEGA"]:
            assert all(value not in text for text in [events, *texts])

    # Compensation runs from the stored action: the placeholder is never sent as a secret.
    response = api_post(
        client_for(operator),
        f"/api/side-effects/{effect.operation_id}/compensate",
        {"reason": "undo for the test"},
        key="u-1",
    )
    assert response.json()["status"] == "compensated"
    undo = recorder.seen[-1]
    assert undo.path == "/undo"
    assert "Authorization" not in undo.headers
    assert undo.headers["X-Trace-Id"] == "undo-trace"
    stored = _stored_text(effect)
    assert "undo-OMEGA" not in stored


def test_a_worker_over_http_gets_its_request_stored_redacted(recorder: Recorder) -> None:
    start()
    client = worker_client("secret-worker")
    # Claimed over HTTP: an attempt takes writes only from the token that claimed it.
    claimed = api_post(client, "/api/worker/claim", {"worker_id": "w1"})
    assert claimed.status_code == 200, claimed.content
    lease = claimed.json()
    body = {
        "lease_epoch": lease["lease_epoch"],
        "cancel_epoch": lease["cancel_epoch"],
        "step_id": "notify",
        "tool": "webhook",
        "target": "deploy-hook",
        "request": {"url": recorder.url(), "headers": dict(SECRETS)},
        "reversibility": "compensable",
        "compensating_action": {"url": recorder.url("/undo"), "headers": dict(SECRETS)},
    }
    answer = api_post(client, f"/api/worker/attempts/{lease['attempt_id']}/side-effects", body)
    assert answer.status_code == 200, answer.content
    effect = SideEffect.objects.get(pk=answer.json()["operation_id"])
    for value in VALUES:
        assert value not in _stored_text(effect)


def test_operator_headers_authenticate_what_the_ledger_cannot(
    settings: Any, recorder: Recorder, operator: User
) -> None:
    # The agent's own credential is not stored, so the web process cannot send it when a
    # person compensates; the operator's per-host credential (from the environment) is.
    settings.HOLDPOINT_WEBHOOK_HEADERS = {"127.0.0.1": {"Authorization": "Bearer OPS-KAPPA"}}
    start()
    lease = claim()
    done = ledger.side_effect_perform(
        **epochs(lease),
        step_id="notify",
        tool="webhook",
        target="deploy-hook",
        request={"url": recorder.url(), "headers": {"Authorization": "Bearer agent-LAMBDA"}},
        reversibility="compensable",
        compensating_action={"url": recorder.url("/undo"), "headers": dict(SECRETS)},
    )
    assert recorder.seen[0].headers["Authorization"] == "Bearer agent-LAMBDA"  # its own wins
    response = api_post(
        client_for(operator),
        f"/api/side-effects/{done.side_effect.operation_id}/compensate",
        {"reason": "undo for the test"},
        key="u-2",
    )
    assert response.json()["status"] == "compensated"
    assert recorder.seen[-1].headers["Authorization"] == "Bearer OPS-KAPPA"
    stored = _stored_text(done.side_effect) + json.dumps(response.json())
    assert "OPS-KAPPA" not in stored and "agent-LAMBDA" not in stored


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("not json", "is not JSON"),
        ('["x"]', "must be a JSON object"),
        ('{"h.example": {"Host": "x"}}', "set by the HTTP client"),
        ('{"h.example": {"X-A": "1\\r\\n2"}}', "must be one line"),
    ],
)
def test_bad_operator_headers_stop_start_up(tmp_path: Any, raw: str, message: str) -> None:
    from tests.ops.test_settings import manage

    result = manage("check", HOLDPOINT_VAR_DIR=str(tmp_path), HOLDPOINT_WEBHOOK_HEADERS=raw)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr
