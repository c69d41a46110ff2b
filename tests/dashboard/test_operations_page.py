"""The operations page (dashboard/views/operations.py) through Django's test client: who
may see it, what an unknown window shows, the navigation link, and untrusted names escaped.
The figures themselves: tests/runs/test_stats.py; in Chromium: tests/browser/."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.runs.stats_history import BETA, seed_history

pytestmark = pytest.mark.django_db

URL = "/operations/"


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_operators_and_admins_see_it_in_the_navigation(operator: User) -> None:
    response = client_for(operator).get("/runs/")
    assert b'href="/operations/"' in response.content
    page = client_for(operator).get(URL)
    assert page.status_code == 200
    assert b'aria-current="page">Last 24 hours' in page.content


@pytest.mark.parametrize("persona", ["approver", "viewer", "outsider"])
def test_anyone_else_gets_a_403_and_no_link(request: pytest.FixtureRequest, persona: str) -> None:
    user = request.getfixturevalue(persona)
    client = client_for(user)
    response = client.get(URL)
    assert response.status_code == 403
    assert b"Only operators and admins can see the operations page." in response.content
    if persona != "outsider":
        assert b'href="/operations/"' not in client.get("/runs/").content


def test_it_needs_a_sign_in_and_answers_only_get(operator: User) -> None:
    anonymous = Client().get(URL)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert client_for(operator).post(URL).status_code == 405


def test_an_unknown_window_shows_the_day(operator: User) -> None:
    page = client_for(operator).get(URL, {"window": "<script>"})
    assert page.status_code == 200
    assert b'aria-current="page">Last 24 hours' in page.content
    assert b"<script>" not in page.content.split(b"</head>")[1].replace(b"<script src", b"")


def test_untrusted_names_are_escaped(operator: User) -> None:
    seed_history()
    content = client_for(operator).get(URL).content.decode()
    assert BETA not in content
    assert "beta&lt;i&gt;x&lt;/i&gt;" in content
    assert "upstream &lt;b&gt;slow&lt;/b&gt;" in content
