"""Clients for the HTTP API: a person's DRF token, a worker token, and a few helpers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from runs.tokens import worker_token_create


def client_for(user: User | None) -> APIClient:
    client = APIClient()
    if user is not None:
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def worker_client(name: str = "pyworker") -> APIClient:
    _, secret = worker_token_create(name=name)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def post(client: APIClient, url: str, body: Any = None, key: str | None = None, **extra: Any):
    if key is not None:
        extra["HTTP_IDEMPOTENCY_KEY"] = key
    return client.post(url, body if body is not None else {}, format="json", **extra)


@pytest.fixture
def admin_user(db: None) -> User:
    user = User.objects.create_user(username="ada", password="pw-ada")
    user.groups.add(Group.objects.get(name="admin"))
    return user


@pytest.fixture
def as_user() -> Callable[[User | None], APIClient]:
    return client_for


@pytest.fixture
def wclient(db: None) -> APIClient:
    return worker_client()


@pytest.fixture(autouse=True)
def _fast_passwords(settings: Any) -> None:
    # The personas are created with passwords; the real hasher costs ~0.2 s per user.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def keep_test_connection() -> Iterator[None]:
    """Let a real WSGI/ASGI handler serve requests inside the test's transaction.

    Handlers close "old" connections at request start and end; Django's test client
    switches that off for its requests, and so must a test that calls a handler directly.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
