"""Under ASGI the middleware chain runs in one thread (config.middleware.SyncChainMiddleware)."""

from __future__ import annotations

import logging

import pytest
from django.core.handlers.asgi import ASGIHandler
from django.test import override_settings


@override_settings(DEBUG=True)  # Django says which handlers it adapts only with DEBUG on
def test_only_the_innermost_handler_is_adapted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="django.request")
    ASGIHandler()
    adapted = [r.getMessage() for r in caplog.records if "adapted" in r.getMessage()]
    # The async base handler is adapted once, for the last middleware; every middleware
    # outside it then runs sync, with no thread hop of its own.
    assert adapted == [
        "Asynchronous handler adapted for middleware config.middleware.SyncChainMiddleware."
    ]


@override_settings(DEBUG=True)
def test_without_it_the_mixin_middlewares_would_run_async(
    caplog: pytest.LogCaptureFixture, settings
) -> None:
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if "SyncChain" not in m]
    caplog.set_level(logging.DEBUG, logger="django.request")
    ASGIHandler()
    adapted = [r.getMessage() for r in caplog.records if "adapted" in r.getMessage()]
    assert not any("SyncChainMiddleware" in m for m in adapted)
    # The adaptation then sits at an outer middleware (whitenoise): sessions, CSRF, auth
    # and the rest inside it run in async mode, each phase through sync_to_async.
    assert adapted and "SessionMiddleware" not in " ".join(adapted)
