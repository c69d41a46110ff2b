"""The private parts of Django, daphne and channels-redis that Holdpoint relies on, each
checked here so that an upgrade that changes one fails this file (and says what to check)
instead of failing quietly in production. Each has its behaviour tested elsewhere too
(named in the assertion message)."""

from __future__ import annotations

import inspect

import pytest


@pytest.mark.django_db
def test_django_keeps_on_commit_callbacks_in_run_on_commit() -> None:
    """``runs/events.py`` (``_waiting``): whether the transaction's ``Changes`` is still
    waiting for the commit is read from ``connection.run_on_commit`` (a list of (savepoint
    ids, callback, robust) triples). Behaviour: tests/live/test_broadcast.py."""
    from django.db import connection, transaction

    with transaction.atomic():
        transaction.on_commit(print, robust=True)
        entries = list(connection.run_on_commit)
        assert entries and len(entries[-1]) == 3 and entries[-1][1] is print


def test_model_backend_caches_a_users_permissions_in_perm_cache() -> None:
    """``runs/permissions.py`` keeps a person's permission set where ModelBackend keeps its
    own (``user._perm_cache``). Behaviour: tests/api/test_request_queries.py."""
    from django.contrib.auth.backends import ModelBackend

    assert "_perm_cache" in inspect.getsource(ModelBackend.get_all_permissions)


def test_django_model_state_marks_a_row_as_loaded() -> None:
    """``runs/services/_base.py`` (``write_run``), ``api/authentication.py``: rows written or
    read by our own SQL are marked loaded with ``_state.adding`` and ``_state.db``."""
    from django.db.models.base import ModelState

    state = ModelState()
    assert state.adding is True and state.db is None


def test_django_asgi_handler_has_what_the_pooled_handler_overrides() -> None:
    """``config/handler.py`` (``PooledASGIHandler``) replaces ``ASGIHandler.handle`` and
    calls ``read_body``, ``create_request``, ``send_response`` and ``get_script_prefix``.
    Behaviour: tests/ops/test_handler.py."""
    from django.core.handlers.asgi import ASGIHandler, get_script_prefix

    for name in ("handle", "read_body", "create_request", "send_response"):
        assert callable(getattr(ASGIHandler, name, None)), name
    assert callable(get_script_prefix)


def test_daphne_reads_bodies_in_web_request_process() -> None:
    """``config/body_limit.py`` subclasses daphne's ``WebRequest`` (``process``,
    ``handleContentChunk``) and sets ``HTTPFactory``'s request factory. Behaviour:
    tests/security/test_limits.py."""
    from daphne.http_protocol import HTTPFactory, WebRequest

    assert callable(WebRequest.process) and callable(WebRequest.handleContentChunk)
    assert "requestFactory" in inspect.getsource(HTTPFactory) or hasattr(HTTPFactory, "protocol")


@pytest.mark.parametrize(
    ("package", "checked"),
    [("django", "5.2"), ("daphne", "4."), ("channels", "4."), ("channels_redis", "4.")],
)
def test_the_versions_these_overrides_were_checked_against(package: str, checked: str) -> None:
    """An upgrade past these fails here: re-read the overrides above against the new
    version (and its release notes), then move the pin."""
    from importlib.metadata import version

    assert version(package.replace("_", "-")).startswith(checked), (
        f"{package} {version(package.replace('_', '-'))}: check the overrides in this file"
    )
