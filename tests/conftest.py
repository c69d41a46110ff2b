"""Shared fixtures: personas, a registered test agent, and the PostgreSQL/Redis gates.

A test marked ``postgres`` needs PostgreSQL row locking. Outside CI, on SQLite, it
is skipped with the reason; in CI (``CI=true``) it fails instead, so a missing
database can never turn into a green run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection

from runs.agents import AgentSpec, RetryPolicy, register_agent_spec, unregister_agent_spec
from runs.groups import ensure_default_groups

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# The tests' webhook receivers listen on loopback, which the outbound guard refuses by
# default (ledger/outbound.py). Worker and server processes the tests start inherit this;
# tests/security turns it off again where the guard itself is tested.
os.environ.setdefault("HOLDPOINT_OUTBOUND_ALLOW_LOCAL", "true")


@pytest.fixture(autouse=True)
def _outbound_allows_loopback(settings: Any) -> None:
    settings.HOLDPOINT_OUTBOUND_ALLOW_LOCAL = True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    on_postgres = bool(os.environ.get("DATABASE_URL"))
    has_redis = bool(os.environ.get("REDIS_URL"))
    for item in items:
        if "postgres" in item.keywords and not on_postgres:
            if IN_CI:
                item.add_marker(pytest.mark.usefixtures("_require_postgres"))
            else:
                item.add_marker(pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL)"))
        if "redis" in item.keywords and not has_redis:
            if IN_CI:
                item.add_marker(pytest.mark.usefixtures("_require_redis"))
            else:
                item.add_marker(pytest.mark.skip(reason="needs Redis (set REDIS_URL)"))


@pytest.fixture
def _require_postgres() -> None:
    pytest.fail("This test needs PostgreSQL and CI=true: set DATABASE_URL.")


@pytest.fixture
def _require_redis() -> None:
    pytest.fail("This test needs Redis and CI=true: set REDIS_URL.")


CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One Chromium for the whole session: Playwright's sync API allows one per thread."""
    if not Path(CHROMIUM).exists():
        message = f"browser tests need Chromium at {CHROMIUM} (scripts/ensure-chromium installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> None:
    """Each test starts with no rate-limit counts and no lockouts (runs/ratelimit.py): the
    cache may be Redis, shared by every test and every run. The database cache is part of
    each test's transaction and needs nothing."""
    from django.core.cache import caches
    from django.core.cache.backends.db import DatabaseCache
    from django.core.cache.backends.redis import RedisCache

    from runs.ratelimit import PREFIX

    backend = caches["default"]
    if isinstance(backend, DatabaseCache):
        return
    if isinstance(backend, RedisCache):
        client = backend._cache.get_client(write=True)
        keys = list(client.scan_iter(match=f"*:{PREFIX}:*", count=1000))
        if keys:
            client.delete(*keys)
        return
    backend.clear()


TEST_AGENT = "test-agent"


@pytest.fixture(autouse=True)
def _claim_listener_closed() -> Iterator[None]:
    """A long-polling claim starts a LISTEN connection (runs/wakeups.py): close it after the
    test, so it never holds the test database open."""
    from runs.wakeups import waiter

    waiter.reopen()
    yield
    waiter.stop()


@pytest.fixture(autouse=True)
def _fresh_worker_contacts() -> None:
    # The process remembers which workers it wrote lately (runs/services/workers.py); the
    # rows of the last test were rolled back, so it must forget them too.
    from runs.services.workers import forget_contacts

    forget_contacts()


@pytest.fixture(autouse=True)
def test_agent() -> Iterator[AgentSpec]:
    spec = AgentSpec(
        name=TEST_AGENT,
        input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
        retry_policy=RetryPolicy(
            max_attempts=4,
            backoff_initial=0.0,
            jitter=0.0,
            non_retryable=("ValueError",),
            repeated_error_threshold=3,
            max_lease_losses=2,
        ),
    )
    register_agent_spec(spec)
    yield spec
    unregister_agent_spec(TEST_AGENT)


def _user(username: str, group: str | None) -> User:
    # transactional_db tests flush the tables, groups included: make sure they exist.
    ensure_default_groups()
    user = User.objects.create_user(username=username, password="pw-" + username)
    if group:
        user.groups.add(Group.objects.get(name=group))
    return user


@pytest.fixture
def operator(db: None) -> User:
    return _user("olivia", "operator")


@pytest.fixture
def approver(db: None) -> User:
    return _user("alice", "approver")


@pytest.fixture
def viewer(db: None) -> User:
    return _user("victor", "viewer")


@pytest.fixture
def outsider(db: None) -> User:
    return _user("oscar", None)


def on_postgres() -> bool:
    return connection.vendor == "postgresql"
