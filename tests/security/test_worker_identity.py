"""Issue 25: the identity a worker sends is hostile input like any other. Every
``Holdpoint-Worker-*`` header with each nasty string (NUL, a lone surrogate, CRLF, 10,000
characters, an RTL override …) on the claim and on a heartbeat: a 4xx problem with a code
or an accepted call, never a 500; what is recorded is within every limit; and the Workers
page and ``GET /api/workers`` show it escaped."""

from __future__ import annotations

import itertools

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from api.worker_identity import HEADERS
from runs.models import Worker
from runs.services.workers import forget_contacts
from tests.api.conftest import client_for, worker_client
from tests.conftest import TEST_AGENT
from tests.runs.factory import start
from tests.security.test_no_server_errors import NASTY, PROBLEM

pytestmark = pytest.mark.django_db


def meta(header: str) -> str:
    return "HTTP_" + header.upper().replace("-", "_")


def test_no_identity_header_gives_a_server_error() -> None:
    worker = worker_client("fuzz")
    start()
    lease = worker.post(
        "/api/worker/claim", {"worker_id": "fuzz/1", "wait": 0}, format="json"
    ).json()
    tried = 0
    for (field, header), (label, nasty) in itertools.product(HEADERS.items(), NASTY.items()):
        forget_contacts()
        try:
            value = nasty.encode("latin-1", "replace").decode("latin-1")
        except UnicodeError:
            value = "?"
        extra = {meta(HEADERS["name"]): "fuzz", meta(header): value}
        for path, body in (
            ("/api/worker/claim", {"worker_id": "fuzz/1", "agents": [TEST_AGENT], "wait": 0}),
            (
                f"/api/worker/attempts/{lease['attempt_id']}/heartbeat",
                {"lease_epoch": lease["lease_epoch"]},
            ),
        ):
            response = worker.post(path, body, format="json", **extra)
            what = f"POST {path} {field}={label}"
            assert response.status_code < 500, f"{what}: {response.content[:300]!r}"
            if response.status_code >= 400:
                assert response["Content-Type"].startswith(PROBLEM), what
                assert response.json()["code"] in ("malformed_request", "stale_worker"), what
            tried += 1
    assert tried > 100
    for row in Worker.objects.all():
        assert len(row.name) <= 100 and len(row.host) <= 200 and len(row.client) <= 100
        assert row.name.isprintable() and row.host.isprintable()


def test_a_hostile_name_is_text_on_the_page_and_in_the_api() -> None:
    name = "<img src=x onerror=alert(1)>\u202e"
    worker = worker_client("fuzz")
    response = worker.post(
        "/api/worker/claim",
        {"worker_id": "x/1", "wait": 0},
        format="json",
        **{meta(HEADERS["name"]): "<img src=x onerror=alert(1)>", meta(HEADERS["host"]): "h"},
    )
    assert response.status_code == 204
    user = User.objects.create_user(username="opal", password="pw")
    user.groups.add(Group.objects.get(name="operator"))
    [row] = client_for(user).get("/api/workers").json()
    assert row["name"] == name.rstrip("\u202e")
    page = Client()
    page.force_login(user)
    html = page.get("/workers/").content.decode()
    assert "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_identity_is_not_read_before_the_token() -> None:
    anonymous = Client().post(
        "/api/worker/claim",
        {"worker_id": "x/1"},
        content_type="application/json",
        **{meta(HEADERS["name"]): "x" * 10_000},
    )
    assert anonymous.status_code == 401
    assert not Worker.objects.exists()
